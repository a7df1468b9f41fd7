package dataplane

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"tern/dataplane/nettest"
	"tern/internal/testwait"
)

// testHost is one host namespace with a VM stand-in, and a bpffs.
func testHost(t *testing.T) (*nettest.Host, *nettest.VM, string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: network namespaces and eBPF")
	}
	lab := nettest.NewLab()
	t.Cleanup(func() { lab.Close() })
	rack, err := nettest.NewRack(lab)
	if err != nil {
		t.Fatal(err)
	}
	h, err := rack.AddHost("h")
	if err != nil {
		t.Fatal(err)
	}
	vm, err := rack.AddVM(h, "vm", vmIP, net.HardwareAddr{0x52, 0x54, 0, 0, 0, 2})
	if err != nil {
		t.Fatal(err)
	}
	fs := t.TempDir()
	if err := MountBPFFS(fs); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(fs, unix.MNT_DETACH) })
	return h, vm, filepath.Join(fs, "tern")
}

// TestCloseReleasesAllButThePinnedMaps: Close stops the reaper, removes
// the VXLAN device and is idempotent; a new plane on the same pin
// directory reuses the maps, keeping the counters and clearing the table.
func TestCloseReleasesAllButThePinnedMaps(t *testing.T) {
	h, vm, pins := testHost(t)
	cfg := Config{Underlay: hostB, PinDir: pins, Netns: h.NS.Path()}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AttachPort(Port{InstanceID: "vm", Device: vm.Device, MAC: vm.MAC, VNI: 7, IP: vm.IP}); err != nil {
		t.Fatal(err)
	}
	if err := p.Apply([]Mapping{{VNI: 7, IP: vm.IP, InstanceID: "vm", Underlay: hostB}, {VNI: 7, IP: netip.MustParseAddr("10.7.0.9"), InstanceID: "far", Underlay: hostA}}); err != nil {
		t.Fatal(err)
	}
	// One frame from the guest to nowhere, so a counter is not zero.
	frame := nettest.UDPFrame(DefaultRouterMAC, vm.MAC, netip.AddrPortFrom(vm.IP, 1), netip.AddrPortFrom(netip.MustParseAddr("10.7.0.77"), 1), []byte("x"))
	if err := vm.NS.SendFrame("eth0", frame); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, eventuallyWait, "the frame is counted", func() bool {
		c, err := p.Counters()
		return err == nil && c[CounterDropNoMapping] > 0
	})
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.reaped:
	default:
		t.Fatal("the reaper goroutine runs after Close")
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := p.Apply(nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("Apply after Close: %v, want ErrClosed", err)
	}
	if _, err := h.NS.Ifindex(DefaultDevice); err == nil {
		t.Fatal("the VXLAN device outlived Close")
	}
	for _, m := range []string{"v2p", "ports", "counters"} {
		if _, err := os.Stat(filepath.Join(pins, m)); err != nil {
			t.Errorf("pinned map %s: %v", m, err)
		}
	}

	again, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	c, err := again.Counters()
	if err != nil {
		t.Fatal(err)
	}
	if c[CounterDropNoMapping] == 0 {
		t.Error("the counters did not outlive the plane")
	}
	if e, err := again.Entries(); err != nil || len(e) != 0 {
		t.Errorf("a new plane starts with entries %v (%v)", e, err)
	}
}

// TestForwardingEntryEndsAfterForwardFor: once a local VM's port goes and
// the table maps it to another host, the entry forwards, and the plane's
// reaper turns it into a plain remote entry after ForwardFor.
func TestForwardingEntryEndsAfterForwardFor(t *testing.T) {
	h, vm, pins := testHost(t)
	p, err := New(Config{Underlay: hostB, PinDir: pins, Netns: h.NS.Path(), ForwardFor: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.AttachPort(Port{InstanceID: "vm", Device: vm.Device, MAC: vm.MAC, VNI: 7, IP: vm.IP}); err != nil {
		t.Fatal(err)
	}
	if err := p.Apply([]Mapping{{VNI: 7, IP: vm.IP, InstanceID: "vm", Underlay: hostB}}); err != nil {
		t.Fatal(err)
	}
	if err := p.DetachPort("vm"); err != nil {
		t.Fatal(err)
	}
	if err := p.Apply([]Mapping{{VNI: 7, IP: vm.IP, InstanceID: "vm", Underlay: hostC}}); err != nil {
		t.Fatal(err)
	}
	entry := func() Entry {
		e, err := p.Entries()
		if err != nil || len(e) != 1 {
			t.Fatalf("entries %v (%v): want the moved VM's", e, err)
		}
		return e[0]
	}
	if e := entry(); !e.Forwarding || e.Underlay != hostC || e.Ifindex != 0 {
		t.Fatalf("entry after the move %+v: want forwarding to %v", e, hostC)
	}
	testwait.For(t, eventuallyWait, "the forwarding entry ends", func() bool { return !entry().Forwarding })
	if e := entry(); e.Underlay != hostC {
		t.Fatalf("entry after forwarding %+v: want remote on %v", e, hostC)
	}
}

func TestNewRefusesABadConfigSayingEverything(t *testing.T) {
	_, err := New(Config{Underlay: netip.MustParseAddr("fd00::1"), Device: "a-name-longer-than-fifteen", RouterMAC: net.HardwareAddr{1}})
	if err == nil {
		t.Fatal("a bad config was accepted")
	}
	for _, want := range []string{"underlay", "pin directory", "device name", "router mac"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %s", err, want)
		}
	}
}

// eventuallyWait bounds the waits for the kernel's maps, which offer no
// notification (testwait.For checks them on a short ticker).
const eventuallyWait = 30 * time.Second
