package main

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"tern/tools/kvmhost"
)

// TestBenchStartRefusesInsideTheEmulatedTestHost runs tern bench start as
// the emulated test host's init would run it: it exits 1, saying why.
func TestBenchStartRefusesInsideTheEmulatedTestHost(t *testing.T) {
	cmd := exec.Command(ternBin, "bench", "start", "--runs", "1")
	cmd.Env = append(os.Environ(), kvmhost.InsideEnv+"=1")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	err := cmd.Run()
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.ExitCode() != 1 {
		t.Fatalf("tern bench start inside: %v; want exit status 1", err)
	}
	if want := "tern: " + kvmhost.ErrBenchmarkInEmulatedHost.Error() + "\n"; stderr.String() != want {
		t.Fatalf("stderr = %q\nwant %q", stderr.String(), want)
	}
}
