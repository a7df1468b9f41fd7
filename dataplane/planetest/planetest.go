// Package planetest is the data plane's test fixture: a rack of host
// namespaces (nettest), a plane on each with a bpffs of the test's own,
// and the waits on their counters, each torn down by the test's cleanup.
// The dataplane tests and dataplane/vmtest share it.
package planetest

import (
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"tern/dataplane"
	"tern/dataplane/nettest"
	"tern/internal/kvmhost"
)

// NeedRoot skips where the test cannot build namespaces or load programs;
// CI runs as root, where nothing skips.
func NeedRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: network namespaces and eBPF")
	}
}

// NewRack makes a rack in a lab of its own (skipping without root); the
// cleanup removes every namespace.
func NewRack(t testing.TB) *nettest.Rack {
	t.Helper()
	NeedRoot(t)
	lab := nettest.NewLab()
	t.Cleanup(func() {
		if err := lab.Close(); err != nil {
			t.Error(err)
		}
	})
	r, err := nettest.NewRack(lab)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// AddHost adds a host to r.
func AddHost(t testing.TB, r *nettest.Rack, name string) *nettest.Host {
	t.Helper()
	h, err := r.AddHost(name)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// NewPlane starts h's plane, attaching with mode, its maps pinned on a
// bpffs mounted for the test alone; the cleanup closes it. Inside the
// emulated test host the plane logs to stderr, so the run outside reads
// how the programs were attached there.
func NewPlane(t testing.TB, h *nettest.Host, mode dataplane.AttachMode) *dataplane.Plane {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
		t.Fatalf("mounting a bpffs: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	cfg := dataplane.Config{Underlay: h.Underlay, PinDir: filepath.Join(dir, "tern"), Netns: h.NS.Path(), Attach: mode}
	if kvmhost.InsideEmulatedHost() {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	p, err := dataplane.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Error(err)
		}
	})
	return p
}

// Apply makes table the mapping table of each of planes, in order.
func Apply(t testing.TB, table []dataplane.Mapping, planes ...*dataplane.Plane) {
	t.Helper()
	for _, p := range planes {
		if err := p.Apply(table); err != nil {
			t.Fatal(err)
		}
	}
}

// Counters reads p's counters.
func Counters(t testing.TB, p *dataplane.Plane) dataplane.Counters {
	t.Helper()
	c, err := p.Counters()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// WaitFor bounds every wait of WaitCounter.
const WaitFor = 2 * time.Minute

// WaitCounter waits (up to WaitFor) until counter c of p has grown by at
// least n since before.
func WaitCounter(t testing.TB, p *dataplane.Plane, before dataplane.Counters, c dataplane.Counter, n uint64) {
	t.Helper()
	deadline := time.Now().Add(WaitFor)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		now := Counters(t, p)
		if now[c]-before[c] >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("counter %s grew by %d in %v, want %d; counters now %v", c, now[c]-before[c], WaitFor, n, now)
		}
		<-tick.C
	}
}

// UDPConn opens a UDP socket on vm's address and port, inside its
// namespace; the cleanup closes it.
func UDPConn(t testing.TB, vm *nettest.VM, port uint16) *net.UDPConn {
	t.Helper()
	c, err := vm.NS.ListenUDP(netip.AddrPortFrom(vm.IP, port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
