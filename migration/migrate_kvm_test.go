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
	checkPauseBreakdown(t, m, false)
	t.Logf("%d MiB dirty guest, %d MiB working set: total %v, downtime %v, %d pre-copy rounds, %d MiB sent, bandwidth %.0f MiB/s",
		memBytes>>20, workingSet>>20, m.res.Total, m.res.Downtime, m.res.Rounds, m.res.BytesSent>>20, last.BandwidthBytesPerSec/(1<<20))
}

// checkPauseBreakdown checks that a successful migration says where its
// pause went: the source's breakdown is in its Result and its last
// progress, its total is the measured downtime, the target's parts are
// the ones the target measured itself (carried by resumed), every part is
// non-negative, and the parts sum to no more than the downtime. That
// holds with no slack: the source's parts are disjoint stretches of its
// pause, each truncated to whole microseconds (a sum of truncations never
// exceeds the truncated sum); the target's happen while the source waits
// for devices-ok and for resumed, stretches no source part covers; and
// both sides read the same monotonic clock here. Parts that always do
// work (parking a vCPU, saving and sending the state, restoring it, the
// finish round trip; over QUIC the last harvest and the last pages' round
// trip too) must have been measured, so are at least a microsecond.
func checkPauseBreakdown(t *testing.T, m *migration, sameHost bool) {
	t.Helper()
	b := m.res.Pause
	t.Logf("pause breakdown: %+v (parts %d us)", b, b.PartsUs())
	if b.TotalUs != m.res.Downtime.Microseconds() {
		t.Errorf("breakdown total %d us, downtime %v", b.TotalUs, m.res.Downtime)
	}
	if last := m.srcLog[len(m.srcLog)-1]; last.PauseBreakdown != b {
		t.Errorf("the source's last progress carries %+v, its Result %+v", last.PauseBreakdown, b)
	}
	if b.RestoreUs != m.dstRes.Pause.RestoreUs || b.ResumeUs != m.dstRes.Pause.ResumeUs {
		t.Errorf("the source has the target's parts as restore %d us, resume %d us; the target measured %d us, %d us",
			b.RestoreUs, b.ResumeUs, m.dstRes.Pause.RestoreUs, m.dstRes.Pause.ResumeUs)
	}
	if last := m.dstLog[len(m.dstLog)-1]; last.PauseBreakdown != m.dstRes.Pause {
		t.Errorf("the target's last progress carries %+v, its Result %+v", last.PauseBreakdown, m.dstRes.Pause)
	}
	parts := map[string]int64{"stop": b.StopUs, "quiesce": b.QuiesceUs, "flush": b.FlushUs, "harvest": b.HarvestUs,
		"last_pages": b.LastPagesUs, "device_state": b.DeviceStateUs, "restore": b.RestoreUs, "finish": b.FinishUs,
		"resume": b.ResumeUs, "other": b.OtherUs}
	for name, us := range parts {
		if us < 0 {
			t.Errorf("part %s is %d us", name, us)
		}
	}
	measured := []string{"stop", "device_state", "restore", "finish"}
	if !sameHost {
		measured = append(measured, "harvest", "last_pages")
	} else if b.HarvestUs != 0 || b.LastPagesUs != 0 {
		t.Errorf("same host: harvest %d us, last pages %d us; want none", b.HarvestUs, b.LastPagesUs)
	}
	for _, name := range measured {
		if parts[name] == 0 {
			t.Errorf("part %s was not measured", name)
		}
	}
	if b.PartsUs() > b.TotalUs || b.OtherUs != b.TotalUs-b.PartsUs() {
		t.Errorf("parts sum to %d us, other %d us, total %d us", b.PartsUs(), b.OtherUs, b.TotalUs)
	}
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
	checkPauseBreakdown(t, m, true)
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

// TestAVersion1TargetStillMigrates: a target that speaks only protocol
// version 1 sends an empty resumed; the source reads it, and its breakdown
// holds no target parts (their time is in OtherUs).
func TestAVersion1TargetStillMigrates(t *testing.T) {
	kvmtest.Require(t)
	a, spec := dirtySource(t, 64<<20, 1<<20)
	m := &migration{src: SourceConfig{VM: a.vm, Spec: mustJSON(t, spec)}, dst: TargetConfig{Versions: []apiv1.MigrationVersion{1}}}
	m.run(t)
	if m.err != nil || m.dstErr != nil {
		t.Fatalf("Send: %v; Receive: %v", m.err, m.dstErr)
	}
	checkTargetRunsOn(t, m.dstVM)
	b := m.res.Pause
	if m.res.Version != 1 || b.RestoreUs != 0 || b.ResumeUs != 0 || b.DeviceStateUs == 0 || b.OtherUs != b.TotalUs-b.PartsUs() {
		t.Errorf("version %d, breakdown %+v; want version 1 and no target parts", m.res.Version, b)
	}
	if m.dstRes.Pause.RestoreUs == 0 {
		t.Errorf("the target measured no restore: %+v", m.dstRes.Pause)
	}
}
