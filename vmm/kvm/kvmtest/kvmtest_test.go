package kvmtest

import (
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"tern/tools/kvmhost"
)

func TestMain(m *testing.M) { Main(m, WithTern()) }

func TestRequirePassesWhereTestsRun(t *testing.T) {
	Require(t)
	if Inside() != kvmhost.InsideEmulatedHost() {
		t.Errorf("Inside() = %v, InsideEmulatedHost() = %v", Inside(), kvmhost.InsideEmulatedHost())
	}
}

// TestTernIsCarriedIn runs the tern binary built on the host, here or in
// the emulated host.
func TestTernIsCarriedIn(t *testing.T) {
	out, err := exec.Command(Tern(t), "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("tern --help: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "tern") {
		t.Fatalf("tern --help printed %q", out)
	}
}

func TestTestTimeoutAddsBootAllowance(t *testing.T) {
	t.Setenv(kvmhost.TimeoutEnv, "")
	os.Unsetenv(kvmhost.TimeoutEnv)
	for _, c := range []struct {
		args []string
		want time.Duration
	}{
		{[]string{"-test.v", "-test.timeout=10m0s"}, 10*time.Minute + bootAllowance},
		{[]string{"-test.timeout", "1m"}, time.Minute + bootAllowance},
		{[]string{"-test.timeout=0s"}, 0},
		{[]string{"-test.run=X"}, 0},
	} {
		if got := testTimeout(c.args); got != c.want {
			t.Errorf("testTimeout(%q) = %v, want %v", c.args, got, c.want)
		}
	}
	t.Setenv(kvmhost.TimeoutEnv, "5m")
	if got := testTimeout([]string{"-test.timeout=10m"}); got != 0 {
		t.Errorf("with %s set: %v, want 0 (kvmhost reads it)", kvmhost.TimeoutEnv, got)
	}
}
