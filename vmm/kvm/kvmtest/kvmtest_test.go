package kvmtest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"tern/internal/kvmhost"
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

// tbRecorder records what Require asks of its testing.TB; like testing.T,
// a skip or a failure ends the goroutine that calls it.
type tbRecorder struct {
	testing.TB
	skipped, failed string
}

func (r *tbRecorder) Helper() {}
func (r *tbRecorder) Skipf(format string, args ...any) {
	r.skipped = fmt.Sprintf(format, args...)
	runtime.Goexit()
}
func (r *tbRecorder) Fatalf(format string, args ...any) {
	r.failed = fmt.Sprintf(format, args...)
	runtime.Goexit()
}
func (r *tbRecorder) Fatal(args ...any) {
	r.failed = fmt.Sprint(args...)
	runtime.Goexit()
}

// require runs Require against a recorder in its own goroutine.
func require(t *testing.T) *tbRecorder {
	r := &tbRecorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		Require(r)
	}()
	<-done
	return r
}

func TestRequireSkipsOutsideAndFailsInside(t *testing.T) {
	saved := state
	t.Cleanup(func() { state = saved })
	state.probeErr = errors.New("opening KVM: open /dev/kvm: no such file or directory")

	state.inside = false
	r := require(t)
	if !strings.HasPrefix(r.skipped, "no usable /dev/kvm: opening KVM") || r.failed != "" {
		t.Errorf("outside: skipped %q, failed %q", r.skipped, r.failed)
	}

	state.inside = true
	r = require(t)
	if r.failed == "" || r.skipped != "" {
		t.Errorf("inside: skipped %q, failed %q; want a failure", r.skipped, r.failed)
	}
}

// TestAlwaysReexecutesInEmulatedHost runs one test of this binary again
// with TERN_KVMHOST=always, so that the re-execution path is exercised on
// machines whose /dev/kvm works too: one boot.
func TestAlwaysReexecutesInEmulatedHost(t *testing.T) {
	if Inside() {
		t.Skip("already inside the emulated test host")
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skip("qemu-system-x86_64 not installed (apt-get install qemu-system-x86)")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, "-test.run=^TestTernIsCarriedIn$", "-test.v")
	cmd.Env = append(os.Environ(), ModeEnv+"=always")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("re-executed test binary: %v\n%s", err, out)
	}
	if got := strings.Count(string(out), InsideBanner+"\n"); got != 1 {
		t.Errorf("banner printed %d times, want once:\n%s", got, out)
	}
	if !strings.Contains(string(out), "--- PASS: TestTernIsCarriedIn") {
		t.Errorf("TestTernIsCarriedIn did not pass inside:\n%s", out)
	}
}

func TestFuzzingIsToldFromTheArguments(t *testing.T) {
	for _, c := range []struct {
		args []string
		want bool
	}{
		{[]string{"-test.run=^$", "-test.fuzz=^FuzzX$", "-test.fuzztime=10s"}, true},
		{[]string{"-test.fuzz", "FuzzX"}, true},
		{[]string{"-test.fuzzworker", "-test.fuzzcachedir=/tmp/c"}, true},
		{[]string{"-test.fuzz="}, false},
		{[]string{"-test.run=FuzzX", "-test.v"}, false},
		{nil, false},
	} {
		if got := fuzzing(c.args); got != c.want {
			t.Errorf("fuzzing(%q) = %v, want %v", c.args, got, c.want)
		}
	}
}

func TestTheOwnHostsArgumentsSplitThePackage(t *testing.T) {
	args := []string{"-test.timeout=45m", "-test.skip=Slow", "-test.v"}
	if v, ok := flagValue(args, "test.skip"); !ok || v != "Slow" {
		t.Fatalf("flagValue(test.skip) = %q, %v", v, ok)
	}
	if _, ok := flagValue(args, "test.run"); ok {
		t.Fatal("flagValue found a -test.run that is not there")
	}
	if v, ok := flagValue([]string{"-test.run", "X"}, "test.run"); !ok || v != "X" {
		t.Fatalf("flagValue of a separate value = %q, %v", v, ok)
	}
	rest := withFlag(args, "test.skip", joinPatterns("Slow", "Linux"))
	if got, want := strings.Join(rest, " "), "-test.timeout=45m -test.v -test.skip=(Slow)|(Linux)"; got != want {
		t.Errorf("the rest's arguments: %q, want %q", got, want)
	}
	own := withFlag([]string{"-test.run", "Old", "-test.v"}, "test.run", "Linux")
	if got, want := strings.Join(own, " "), "-test.v -test.run=Linux"; got != want {
		t.Errorf("the own host's arguments: %q, want %q", got, want)
	}
	if got := joinPatterns("", "Linux"); got != "Linux" {
		t.Errorf("joinPatterns with no skip = %q", got)
	}
}

func TestOnlyTestsThatAllTripleFaultedAtTheResetVectorRunAgain(t *testing.T) {
	fault := "    serve_test.go:151: running VM: vCPU 1 " + EmulatorTripleFault
	other := "    x_test.go:9: running VM: vCPU 0 at rip 0x1008c3: guest triple-faulted (KVM_EXIT_SHUTDOWN)"
	for _, c := range []struct {
		name string
		out  string
		want []string
	}{
		{"passed", "ok\nPASS\n", nil},
		{"one faulted", "--- PASS: TestA (1.00s)\n--- FAIL: TestLinuxVolume (300.00s)\n" + fault + "\nFAIL\n", []string{"TestLinuxVolume"}},
		{"faulted under -v", "=== RUN   TestLinuxVolume\n" + fault + "\n--- FAIL: TestLinuxVolume (300.00s)\n=== RUN   TestB\n--- PASS: TestB (0.10s)\nFAIL\n", []string{"TestLinuxVolume"}},
		{"two faulted", "--- FAIL: TestL1 (3.00s)\n" + fault + "\n--- FAIL: TestL2 (3.00s)\n    --- FAIL: TestL2/sub (1.00s)\n    " + fault + "\nFAIL\n", []string{"TestL1", "TestL2"}},
		{"one faulted, one broken", "--- FAIL: TestL1 (3.00s)\n" + fault + "\n--- FAIL: TestL2 (3.00s)\n    x_test.go:9: checksum differs\nFAIL\n", nil},
		{"a triple fault elsewhere", "--- FAIL: TestL1 (3.00s)\n" + other + "\nFAIL\n", nil},
		{"a console that stopped", "--- FAIL: TestL1 (3.00s)\n    x_test.go:9: " + ConsoleStall + "\nFAIL\n", nil},
		{"the fault of another test's log", "--- FAIL: TestL1 (3.00s)\n    x_test.go:9: checksum differs\n--- PASS: TestL2 (3.00s)\n" + fault + "\nFAIL\n", nil},
		{"a timeout panic", fault + "\npanic: test timed out after 17m0s\n", nil},
	} {
		got := testsFailedWith(c.out, EmulatorTripleFault)
		if fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("%s: testsFailedWith = %q, want %q", c.name, got, c.want)
		}
	}
}
