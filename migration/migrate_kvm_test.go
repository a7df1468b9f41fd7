package migration

import (
	"errors"
	"path/filepath"
	"testing"
	"time"

	"tern/instance/apiv1"
	"tern/vmm"
	"tern/vmm/kvm"
	"tern/vmm/kvm/kvmtest"
)

// checkTargetRunsOn checks that the migrated guest on vm keeps its whole
// pattern: a verification it is asked for passes, after the output the
// source had printed.
func checkTargetRunsOn(t testing.TB, vm *vmm.VM) {
	t.Helper()
	_, end := vm.Serial().Output().Bounds()
	c := newConsole(vm.Serial().Output(), end)
	requestVerify(t, vm)
	v := c.waitVerifyPass(t)
	requestVerify(t, vm)
	v2 := c.waitVerifyPass(t)
	if v2.Generation < v.Generation {
		t.Fatalf("generation went back from %d to %d", v.Generation, v2.Generation)
	}
}

func TestMigrateARunningDirtyGuestOverQUIC(t *testing.T) {
	kvmtest.Require(t)
	for _, c := range []struct {
		name                 string
		memBytes, workingSet uint64
	}{
		{"128MiB", 128 << 20, 4 << 20},
		// A working set too large to fit the downtime target at loopback
		// speed: pre-copy iterates, up to the round limit.
		{"256MiB", 256 << 20, 24 << 20},
	} {
		t.Run(c.name, func(t *testing.T) { testMigrateDirtyGuest(t, c.memBytes, c.workingSet) })
	}
}

func testMigrateDirtyGuest(t *testing.T, memBytes, workingSet uint64) {
	a, spec := dirtySource(t, memBytes, workingSet)
	tscBefore, khz := readTSC(t, a.vm)
	wallBefore := time.Now()
	m := &migration{src: SourceConfig{VM: a.vm, Spec: mustJSON(t, spec)}}
	m.run(t)
	if m.err != nil || m.dstErr != nil {
		t.Fatalf("Send: %v; Receive: %v", m.err, m.dstErr)
	}
	if err := a.wait(t); !errors.Is(err, vmm.ErrStopped) {
		t.Fatalf("the source's Run = %v, want ErrStopped", err)
	}
	// Guest time moved on with the host's across the migration: the
	// target's TSC is ahead of the source's by at least the time between
	// the two reads (less a margin for the frequency KVM reports).
	wallAfter := time.Now()
	tscAfter, _ := readTSC(t, m.dstVM)
	if min := uint64(float64(wallAfter.Sub(wallBefore).Microseconds()) * float64(khz) / 1000 * 0.9); tscAfter < tscBefore || tscAfter-tscBefore < min {
		t.Errorf("guest TSC went from %d to %d across %v: want at least %d more", tscBefore, tscAfter, wallAfter.Sub(wallBefore), min)
	}
	checkTargetRunsOn(t, m.dstVM)
	last := m.srcLog[len(m.srcLog)-1]
	if last.Phase != apiv1.PhaseFinish || last.TotalMs <= 0 || last.DowntimeMs <= 0 {
		t.Errorf("last progress %+v", last)
	}
	checkPhaseOrder(t, m.srcLog)
	t.Logf("%d MiB dirty guest, %d MiB working set: total %v, downtime %v, %d pre-copy rounds, %d MiB sent, bandwidth %.0f MiB/s",
		memBytes>>20, workingSet>>20, m.res.Total, m.res.Downtime, m.res.Rounds, m.res.BytesSent>>20, last.BandwidthBytesPerSec/(1<<20))
}

// checkPhaseOrder checks the published phases follow the protocol order.
func checkPhaseOrder(t *testing.T, log []apiv1.Progress) {
	t.Helper()
	next := 0
	for _, p := range log {
		for next < len(apiv1.Phases) && apiv1.Phases[next] != p.Phase {
			next++
		}
		if next == len(apiv1.Phases) {
			t.Fatalf("phase %v out of order in %+v", p.Phase, log)
		}
	}
}

func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	b, err := jsonMarshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestSameHostMigrationHandsOverTheMemfds(t *testing.T) {
	kvmtest.Require(t)
	a, spec := dirtySource(t, 128<<20, 4<<20)
	sock := filepath.Join(t.TempDir(), "m.sock")
	m := &migration{src: SourceConfig{VM: a.vm, Spec: mustJSON(t, spec), SameHostSocket: sock}}
	m.run(t)
	if m.err != nil || m.dstErr != nil {
		t.Fatalf("Send: %v; Receive: %v", m.err, m.dstErr)
	}
	if m.res.BytesSent != 0 || m.dstRes.BytesSent != 0 {
		t.Fatalf("%d bytes of pages sent, %d received; want none", m.res.BytesSent, m.dstRes.BytesSent)
	}
	if err := a.wait(t); !errors.Is(err, vmm.ErrStopped) {
		t.Fatalf("the source's Run = %v, want ErrStopped", err)
	}
	// The source's VM lets go of its mapping and memfd; the target's
	// guest keeps the pages.
	if err := a.vm.Close(); err != nil {
		t.Fatal(err)
	}
	checkTargetRunsOn(t, m.dstVM)
	t.Logf("same-host 128 MiB dirty guest: total %v, downtime %v", m.res.Total, m.res.Downtime)
}

func TestSameHostFailureAfterTheHandOverResumesTheSource(t *testing.T) {
	kvmtest.Require(t)
	a, spec := dirtySource(t, 64<<20, 1<<20)
	sock := filepath.Join(t.TempDir(), "m.sock")
	m := &migration{src: SourceConfig{VM: a.vm, Spec: mustJSON(t, spec), SameHostSocket: sock},
		dst: TargetConfig{Injector: NewInjector(InjectorSpec{Phase: apiv1.PhaseDevice, FailImports: 1})}}
	m.run(t)
	if !errors.Is(m.err, ErrInjected) || !errors.Is(m.dstErr, ErrInjected) {
		t.Fatalf("Send: %v; Receive: %v", m.err, m.dstErr)
	}
	checkSourceRunsOn(t, a)
}

// readTSC pauses vm, reads vCPU 0's TSC and frequency, and resumes it.
func readTSC(t *testing.T, vm *vmm.VM) (tsc uint64, khz uint32) {
	t.Helper()
	if err := vm.Pause(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := vm.Resume(); err != nil {
			t.Fatal(err)
		}
	}()
	c := vm.KVMVCPUs()[0]
	got, err := c.MSRs([]uint32{kvm.MSRIA32TSC})
	if err != nil || len(got) != 1 {
		t.Fatalf("reading the TSC: %v %v", got, err)
	}
	if khz, err = c.TSCKHz(); err != nil {
		t.Fatal(err)
	}
	return got[0].Data, khz
}

func TestMigrateAGuestWithAParkedApplicationProcessor(t *testing.T) {
	kvmtest.Require(t)
	a, spec := dirtySourceWith(t, 64<<20, 1<<20, 2)
	m := &migration{src: SourceConfig{VM: a.vm, Spec: mustJSON(t, spec)}}
	m.run(t)
	if m.err != nil || m.dstErr != nil {
		t.Fatalf("Send: %v; Receive: %v", m.err, m.dstErr)
	}
	checkTargetRunsOn(t, m.dstVM)
	// The application processor parked at its HLT again rather than
	// running past it.
	if err := m.dstVM.Pause(); err != nil {
		t.Fatal(err)
	}
	ap := m.dstVM.KVMVCPUs()[1]
	r, err := ap.Regs()
	if err != nil {
		t.Fatal(err)
	}
	if r.RIP != uint64(vmm.APParkAddr)+1 || ap.ExitReason() != kvm.ExitHLT {
		t.Errorf("the application processor is at rip %#x after exit %v; want just past its HLT at %#x", r.RIP, ap.ExitReason(), uint64(vmm.APParkAddr))
	}
	if err := m.dstVM.Resume(); err != nil {
		t.Fatal(err)
	}
}
