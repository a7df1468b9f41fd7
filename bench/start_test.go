package bench

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"tern/internal/kvmhost"
	"tern/vmm/kvm"
)

// TestRunStartRefusesInsideTheEmulatedTestHost: figures measured on
// software-emulated CPUs are never reported.
func TestRunStartRefusesInsideTheEmulatedTestHost(t *testing.T) {
	t.Setenv(kvmhost.InsideEnv, "1")
	rep, err := RunStart(context.Background(), StartOptions{Tern: "/nonexistent/tern", Runs: 1})
	if !errors.Is(err, kvmhost.ErrBenchmarkInEmulatedHost) || rep != nil {
		t.Fatalf("RunStart inside the emulated host = %v, %v; want ErrBenchmarkInEmulatedHost", rep, err)
	}
}

// TestRunStartReportsEveryFigure runs the start benchmark briefly on real
// vmm processes and checks what it reports, not how fast it was.
func TestRunStartReportsEveryFigure(t *testing.T) {
	if testing.Short() {
		t.Skip("starts vmm processes and reconciles volumes")
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
	rep, err := RunStart(t.Context(), StartOptions{Tern: tern, Runs: 2, Concurrency: 2, SlowDiverge: 0.05, Dir: t.TempDir(), Progress: os.Stderr})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []StartPhase{rep.Sequential, rep.Concurrent} {
		if p.EnsureReturnP99 <= 0 || p.EnsureToRunningP50 <= 0 || p.EnsureReturnSlowP99 <= 0 || p.HealthzP99 <= 0 || p.SlowActivation <= 0 {
			t.Errorf("phase with %d vmms has empty figures: %+v", p.VMMs, p)
		}
		if p.SlowActivationBytes == 0 {
			t.Errorf("phase with %d vmms: the slow volume's activation repaired nothing", p.VMMs)
		}
	}
	if rep.Concurrent.VMMs != 2 || rep.EnsureReturnP99 != rep.Sequential.EnsureReturnP99 || rep.HealthzP99 != rep.Sequential.HealthzP99 {
		t.Errorf("top-level figures are not the sequential phase's: %+v", rep)
	}
}
