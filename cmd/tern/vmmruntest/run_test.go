package vmmruntest

import (
	"bytes"
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"tern/tools/guests"
	"tern/vmm/kvm/kvmtest"
)

func TestMain(m *testing.M) { kvmtest.Main(m, kvmtest.WithTern()) }

// generous bounds each tern run: a busy machine or the emulated host is
// slow, and nothing here asserts on time.
const generous = 3 * time.Minute

// run runs tern with args and stdin and returns stdout, stderr and the
// exit status.
func run(t *testing.T, stdin string, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), generous)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, kvmtest.Tern(t), args...)
	cmd.Stdin = strings.NewReader(stdin)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("tern %q did not end within %v; stdout %q stderr %q", args, generous, stdout.String(), stderr.String())
	}
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("running tern %q: %v", args, err)
	}
	return stdout.String(), stderr.String(), code
}

func TestVMMRunHelloPrintsItsLineAndExitsZero(t *testing.T) {
	kvmtest.Require(t)
	stdout, stderr, code := run(t, "", "vmm", "run", "--guest", "hello")
	if code != 0 {
		t.Fatalf("exit status %d; stderr %q", code, stderr)
	}
	if !strings.Contains(stdout, guests.HelloLine+"\r\n") && !strings.Contains(stdout, guests.HelloLine+"\n") {
		t.Fatalf("stdout %q lacks %q", stdout, guests.HelloLine)
	}
}

func TestVMMRunBadGuestIsOneErrorLine(t *testing.T) {
	stdout, stderr, code := run(t, "", "vmm", "run", "--guest", "nosuch")
	if code != 1 {
		t.Errorf("exit status %d, want 1", code)
	}
	if stdout != "" {
		t.Errorf("stdout %q, want nothing", stdout)
	}
	lines := strings.Split(strings.TrimRight(stderr, "\n"), "\n")
	if len(lines) != 1 || !strings.Contains(lines[0], `unknown guest "nosuch"`) {
		t.Errorf("stderr %q, want one line naming the unknown guest", stderr)
	}
}
