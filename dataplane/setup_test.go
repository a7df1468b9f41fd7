package dataplane_test

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

// needRoot skips where the test cannot build namespaces or load programs;
// CI runs as root, where nothing here skips.
func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: network namespaces and eBPF")
	}
}

func newRack(t *testing.T) *nettest.Rack {
	t.Helper()
	needRoot(t)
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

// bpffs mounts a bpffs of the test's own and returns a directory on it.
func bpffs(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
		t.Fatalf("mounting a bpffs: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	return filepath.Join(dir, "tern")
}

func newPlane(t *testing.T, h *nettest.Host, mode dataplane.AttachMode) *dataplane.Plane {
	t.Helper()
	cfg := dataplane.Config{Underlay: h.Underlay, PinDir: bpffs(t), Netns: h.NS.Path(), Attach: mode}
	if kvmhost.InsideEmulatedHost() {
		// The run outside reads how the programs were attached there.
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

func addHost(t *testing.T, r *nettest.Rack, name string) *nettest.Host {
	t.Helper()
	h, err := r.AddHost(name)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// vmSpec is a VM of a test: its name, VNI and address.
type vmSpec struct {
	name string
	vni  uint32
	ip   string
}

func mac(last byte) net.HardwareAddr { return net.HardwareAddr{0x52, 0x54, 0, 0x74, 0, last} }

// addVM makes the VM stand-in and attaches its port to the host's plane.
func addVM(t *testing.T, r *nettest.Rack, h *nettest.Host, p *dataplane.Plane, s vmSpec) *nettest.VM {
	t.Helper()
	ip := netip.MustParseAddr(s.ip)
	vm, err := r.AddVM(h, s.name, ip, mac(ip.As4()[3]))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AttachPort(dataplane.Port{InstanceID: s.name, Device: vm.Device, MAC: vm.MAC, VNI: s.vni, IP: ip}); err != nil {
		t.Fatal(err)
	}
	return vm
}

func mapping(s vmSpec, on *nettest.Host) dataplane.Mapping {
	return dataplane.Mapping{VNI: s.vni, IP: netip.MustParseAddr(s.ip), InstanceID: s.name, Underlay: on.Underlay}
}

func apply(t *testing.T, table []dataplane.Mapping, planes ...*dataplane.Plane) {
	t.Helper()
	for _, p := range planes {
		if err := p.Apply(table); err != nil {
			t.Fatal(err)
		}
	}
}

func counters(t *testing.T, p *dataplane.Plane) dataplane.Counters {
	t.Helper()
	c, err := p.Counters()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// waitCounter waits (up to a generous deadline) until counter c of p has
// grown by at least n since before.
func waitCounter(t *testing.T, p *dataplane.Plane, before dataplane.Counters, c dataplane.Counter, n uint64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		now := counters(t, p)
		if now[c]-before[c] >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("counter %s grew by %d, want %d; counters now %v", c, now[c]-before[c], n, now)
		}
		<-tick.C
	}
}

func udpConn(t *testing.T, vm *nettest.VM, port uint16) *net.UDPConn {
	t.Helper()
	c, err := vm.NS.ListenUDP(netip.AddrPortFrom(vm.IP, port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func echo(t *testing.T, vm *nettest.VM, port uint16) {
	t.Helper()
	e, err := vm.NS.StartEcho(netip.AddrPortFrom(vm.IP, port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
}
