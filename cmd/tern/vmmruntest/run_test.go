package vmmruntest

import (
	"bytes"
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"tern/vmm/guests"
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

func TestVMMRunListsEveryConfigProblemOnePerLine(t *testing.T) {
	kvmtest.Require(t) // the vCPU limit is KVM's
	stdout, stderr, code := run(t, "", "vmm", "run", "--guest", "/nonexistent/guest.elf", "--memory", "0", "--vcpus", "100000")
	if code != 1 || stdout != "" {
		t.Errorf("exit status %d, stdout %q; want 1 and nothing", code, stdout)
	}
	lines := strings.Split(strings.TrimRight(stderr, "\n"), "\n")
	if len(lines) != 3 {
		t.Fatalf("stderr %q: want three lines", stderr)
	}
	for i, want := range []string{"memory: zero bytes", "reading guest file", "more than this host's KVM allows"} {
		if !strings.Contains(lines[i], want) {
			t.Errorf("line %d %q does not mention %q", i, lines[i], want)
		}
	}
}

func TestVMMRunRejectsBadDiskFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--disk", "bogus"}, "want file:PATH or volume:A,B,C"},
		{[]string{"--disk", "file:/nonexistent/disk.img"}, "opening disk"},
		{[]string{"--certs", "certs"}, "--certs and --gen are for --disk volume"},
		{[]string{"--disk", "volume:a:1,b:2"}, "want 3 addresses"},
	} {
		stdout, stderr, code := run(t, "", append([]string{"vmm", "run", "--guest", "hello"}, c.args...)...)
		lines := strings.Split(strings.TrimRight(stderr, "\n"), "\n")
		if code != 1 || stdout != "" || len(lines) != 1 || !strings.Contains(stderr, c.want) {
			t.Errorf("tern vmm run %q: status %d, stdout %q, stderr %q; want 1, nothing, one line naming %q", c.args, code, stdout, stderr, c.want)
		}
	}
}
