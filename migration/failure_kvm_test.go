package migration

import (
	"errors"
	"fmt"
	"testing"

	"tern/instance/apiv1"
	"tern/vmm"
	"tern/vmm/kvm/kvmtest"
	"tern/vmm/memory"
)

// checkSourceRunsOn checks the source guest was not stopped and still
// verifies its whole pattern.
func checkSourceRunsOn(t *testing.T, a *runningVM) {
	t.Helper()
	select {
	case err := <-a.done:
		t.Fatalf("the source's Run ended: %v", err)
	default:
	}
	_, end := a.vm.Serial().Output().Bounds()
	c := newConsole(a.vm.Serial().Output(), end)
	requestVerify(t, a.vm)
	c.waitVerifyPass(t)
}

// rulePolicy is the pre-copy policy of a test that checks what a failure
// or a refusal does: inside the emulated test host, where pages move
// slowly, three rounds at most (each one more chance of the same outcome).
func rulePolicy() Policy { return Policy{MaxRounds: kvmtest.Sized(0, 3)} }

func TestFailureAtEveryPhaseResumesTheSourceAndNeverRunsTheTarget(t *testing.T) {
	kvmtest.Require(t)
	a, spec := dirtySource(t, 64<<20, 2<<20)
	for _, ph := range apiv1.Phases {
		for _, side := range []string{"export", "import"} {
			t.Run(fmt.Sprintf("%s/%v", side, ph), func(t *testing.T) {
				inj := NewInjector(InjectorSpec{Phase: ph, FailExports: 1})
				m := &migration{src: SourceConfig{VM: a.vm, Spec: mustJSON(t, spec), Policy: rulePolicy()}}
				if side == "export" {
					m.src.Injector = inj
				} else {
					inj = NewInjector(InjectorSpec{Phase: ph, FailImports: 1})
					m.dst.Injector = inj
				}
				// Phase error is published only once the guest runs again:
				// it verifies on request from inside the callback.
				m.onSourceError = func() { checkSourceRunsOn(t, a) }
				m.run(t)
				if !m.sawSourceError {
					t.Fatal("no phase error published")
				}
				if !errors.Is(m.err, ErrInjected) || !errors.Is(m.dstErr, ErrInjected) {
					t.Fatalf("Send: %v; Receive: %v; want both to wrap ErrInjected", m.err, m.dstErr)
				}
				if errors.Is(m.err, ErrCommitted) {
					t.Fatalf("failed after the point of no return: %v", m.err)
				}
				if m.dstVM != nil {
					t.Fatal("Receive returned a VM")
				}
				if m.dstRun != nil {
					if err := m.dstRun.wait(t); !errors.Is(err, vmm.ErrStopped) {
						t.Errorf("the target's Run = %v, want ErrStopped", err)
					}
				}
				if lastPhase(m.srcLog) != apiv1.PhaseError || lastPhase(m.dstLog) != apiv1.PhaseError {
					t.Errorf("last phases %v (source), %v (target); want error", lastPhase(m.srcLog), lastPhase(m.dstLog))
				}
				var sent uint64
				for _, p := range m.srcLog {
					sent = max(sent, p.BytesSent)
				}
				// Rounds resend pages: at least min(sent, all) distinct pages.
				region := a.vm.Memory().Regions()[0]
				want := min(sent/memory.PageSize, region.Size()/memory.PageSize)
				if n := region.Dirty().Count(); n < want {
					t.Errorf("the source re-marked %d pages dirty after sending %d", n, want)
				}
				checkSourceRunsOn(t, a)
			})
		}
	}
	// And the guest still migrates afterwards.
	m := &migration{src: SourceConfig{VM: a.vm, Spec: mustJSON(t, spec), Policy: rulePolicy()}}
	m.run(t)
	if m.err != nil || m.dstErr != nil {
		t.Fatalf("Send: %v; Receive: %v", m.err, m.dstErr)
	}
	checkTargetRunsOn(t, m.dstVM)
}

func TestNoCommonVersionIsACleanErrorOnBothSides(t *testing.T) {
	kvmtest.Require(t)
	a, spec := dirtySource(t, 64<<20, 1<<20)
	m := &migration{src: SourceConfig{VM: a.vm, Spec: mustJSON(t, spec)}, dst: TargetConfig{Versions: []apiv1.MigrationVersion{7, 9}}}
	m.run(t)
	if !errors.Is(m.err, ErrNoCommonVersion) || !errors.Is(m.dstErr, ErrNoCommonVersion) {
		t.Fatalf("Send: %v; Receive: %v; want both to wrap ErrNoCommonVersion", m.err, m.dstErr)
	}
	t.Logf("source: %v\ntarget: %v", m.err, m.dstErr)
	if m.dstRun != nil {
		t.Error("the target built a VM")
	}
	checkSourceRunsOn(t, a)
}

func TestCancelledMigrationResumesTheSource(t *testing.T) {
	kvmtest.Require(t)
	a, spec := dirtySource(t, 64<<20, 1<<20)
	for _, ph := range []apiv1.Phase{apiv1.PhaseRAMPush, apiv1.PhasePause, apiv1.PhaseDevice} {
		t.Run(ph.String(), func(t *testing.T) {
			m := &migration{src: SourceConfig{VM: a.vm, Spec: mustJSON(t, spec), Policy: rulePolicy()}, cancelAt: ph}
			m.run(t)
			if m.err == nil || m.dstErr == nil || errors.Is(m.err, ErrCommitted) {
				t.Fatalf("Send: %v; Receive: %v; want both to fail before commit", m.err, m.dstErr)
			}
			if m.dstVM != nil {
				t.Fatal("Receive returned a VM")
			}
			checkSourceRunsOn(t, a)
		})
	}
}
