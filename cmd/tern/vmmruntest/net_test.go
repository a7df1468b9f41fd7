package vmmruntest

import (
	"context"
	"net"
	"os/exec"
	"strings"
	"testing"

	"tern/vmm/guests"
	"tern/vmm/kvm/kvmtest"
	"tern/vmm/tap/taptest"
)

func TestVMMRunGivesTheGuestItsNetworkCards(t *testing.T) {
	kvmtest.Require(t)
	ns := taptest.New(t)
	// tern runs in the namespace: the TAPs it creates are there and go
	// with it.
	ctx, cancel := context.WithTimeout(context.Background(), generous)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", ns.Name, kvmtest.Tern(t), "vmm", "run", "--guest", "hello",
		"--net", "tap:trun0", "--net", "tap:trun1,mac=52:54:00:aa:bb:cc")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), guests.HelloLine) {
		t.Fatalf("tern vmm run with two cards: %v; output %q; want the hello line and status 0", err, out)
	}
	ns.Do(func() error {
		if _, err := net.InterfaceByName("trun0"); err == nil {
			t.Error("the TAP tern created outlived it")
		}
		return nil
	})
}

func TestVMMRunListsEveryBadNetworkCard(t *testing.T) {
	kvmtest.Require(t) // the cards are checked with the rest of the config
	stdout, stderr, code := run(t, "", "vmm", "run", "--guest", "hello",
		"--net", "tap:a/b", "--net", "tap:x,mac=01:00:00:00:00:01", "--net", "tap:x")
	lines := strings.Split(strings.TrimRight(stderr, "\n"), "\n")
	if code != 1 || stdout != "" || len(lines) != 3 {
		t.Fatalf("status %d, stdout %q, stderr %q; want 1, nothing and three lines", code, stdout, stderr)
	}
	for i, want := range []string{`nics[0]: interface name "a/b"`, "nics[1]: MAC 01:00:00:00:00:01 is a multicast address", "nics[2]: tap x is nics[1]'s too"} {
		if !strings.Contains(lines[i], want) {
			t.Errorf("line %d %q does not say %q", i, lines[i], want)
		}
	}
	if _, stderr, code := run(t, "", "vmm", "run", "--guest", "hello", "--net", "bridge:br0"); code != 1 || !strings.Contains(stderr, "want tap:NAME[,mac=MAC]") {
		t.Errorf("--net bridge:br0: status %d, stderr %q; want 1 and the form", code, stderr)
	}
}
