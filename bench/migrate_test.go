package bench

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"tern/instance"
	"tern/internal/kvmhost"
	"tern/vmm/kvm"
)

// TestMigrateRateZeroIsTheIdleGuest: the benchmark's rate 0 asks the API
// for the idle dirty guest (dirty_mib_per_sec 0 alone would be
// unthrottled), and every rate's spec is one the server accepts.
func TestMigrateRateZeroIsTheIdleGuest(t *testing.T) {
	for _, tc := range []struct {
		rate, idle uint64
		idleSet    bool
	}{{0, 1, true}, {10, 0, false}, {100, 0, false}} {
		s := dirtySpec("bench-256", 256, tc.rate)
		if err := instance.Validate(&s, instance.Host{}); err != nil {
			t.Errorf("rate %d: Validate: %v", tc.rate, err)
		}
		p := s.Guest.Params
		if idle, ok := p["idle"]; idle != tc.idle || ok != tc.idleSet || p["dirty_mib_per_sec"] != tc.rate {
			t.Errorf("rate %d: params %v; want idle %d (set %v) and dirty_mib_per_sec %d", tc.rate, p, tc.idle, tc.idleSet, tc.rate)
		}
	}
}

// TestRunMigrateFillsEveryRow runs the migration benchmark once at its
// smallest (72 MiB, the idle guest and 10 MiB/s) on /dev/kvm and checks
// that every row has every figure, QEMU's too when it is installed; not
// how fast anything was.
func TestRunMigrateFillsEveryRow(t *testing.T) {
	if testing.Short() {
		t.Skip("boots and migrates guests in vmm processes and QEMU")
	}
	if kvmhost.InsideEmulatedHost() {
		t.Skip("the benchmark refuses to run inside the emulated test host")
	}
	if err := kvm.Probe(); err != nil {
		t.Skipf("no usable /dev/kvm: %v", err)
	}
	tern := filepath.Join(t.TempDir(), "tern")
	if out, err := exec.Command("go", "build", "-o", tern, "tern/cmd/tern").CombinedOutput(); err != nil {
		t.Fatalf("building tern: %v\n%s", err, out)
	}
	const size = benchDirtyMemSkip + benchWorkingSet
	rep, err := RunMigrate(t.Context(), MigrateOptions{Tern: tern, SizesMiB: []uint64{size}, RatesMiBPerSec: []uint64{0, TargetRateMiBPerSec}, Progress: os.Stderr})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Scenarios) != 4 {
		t.Fatalf("%d rows; want 4 (QUIC and same host at two rates)", len(rep.Scenarios))
	}
	_, qemuErr := exec.LookPath("qemu-system-x86_64")
	for _, s := range rep.Scenarios {
		if s.MemoryMiB != size || s.TotalMs <= 0 || s.DowntimeGuestMs <= 0 || s.DowntimeVMMMs <= 0 || s.Scenario == "" {
			t.Errorf("row %+v has an empty figure", s)
		}
		if b := s.PauseBreakdown; b == nil || b.TotalUs <= 0 || b.DeviceStateUs <= 0 || b.OtherUs != b.TotalUs-b.PartsUs() || b.OtherUs < 0 {
			t.Errorf("%s %d MiB/s: pause breakdown %+v; want every part, summing to at most the total", s.Scenario, s.DirtyMiBPerSec, b)
		}
		// The same-host path hands the memory over as memfds: nothing is
		// sent, in no rounds.
		if !s.SameHost && (s.BytesSent == 0 || s.Rounds == 0) {
			t.Errorf("%s %d MiB/s: %d bytes in %d rounds; want what pre-copy sent", s.Scenario, s.DirtyMiBPerSec, s.BytesSent, s.Rounds)
		}
		if qemuErr != nil {
			continue
		}
		for name, p := range map[string]*float64{
			"qemu_total_ms": s.QEMUTotalMs, "qemu_downtime_ms": s.QEMUDowntimeMs, "qemu_downtime_guest_ms": s.QEMUDowntimeGuestMs,
			"qemu_at_tern_bw_bytes_per_sec": s.QEMUAtTernBWBytesPerSec, "qemu_at_tern_bw_total_ms": s.QEMUAtTernBWTotalMs,
			"qemu_at_tern_bw_downtime_ms": s.QEMUAtTernBWDowntimeMs, "qemu_at_tern_bw_downtime_guest_ms": s.QEMUAtTernBWDowntimeGuestMs,
		} {
			if p == nil || *p <= 0 {
				t.Errorf("%s %d MiB/s: %s is %v; want a value", s.Scenario, s.DirtyMiBPerSec, name, p)
			}
		}
	}
	var table strings.Builder
	rep.WriteTable(&table)
	t.Logf("\n%s", table.String())
	if !strings.Contains(table.String(), "pause breakdown (ms") {
		t.Errorf("the table has no pause breakdown:\n%s", table.String())
	}
	if !strings.Contains(table.String(), "largest guest gap: ") {
		t.Errorf("the table does not name the largest guest gap:\n%s", table.String())
	}
}
