package dataplane

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"os"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

const (
	tcActShot     = 2
	tcActRedirect = 7
)

// loadForTestRun loads the programs with unpinned maps for
// BPF_PROG_TEST_RUN, where a packet arrives on loopback (ifindex 1): that
// is registered as a port of 10.7.0.1 in VNI 7, and 10.7.0.2 (remote) and
// 10.7.0.3 (local, on loopback too) are mapped.
func loadForTestRun(tb testing.TB) *v2pObjects {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("needs root: loads eBPF programs")
	}
	spec, err := loadV2p()
	if err != nil {
		tb.Fatal(err)
	}
	for _, m := range spec.Maps {
		m.Pinning = ebpf.PinNone
	}
	if err := spec.Variables[v2pVarVxlanIfindex].Set(uint32(1)); err != nil {
		tb.Fatal(err)
	}
	if err := spec.Variables[v2pVarRouterMac].Set([6]byte(DefaultRouterMAC)); err != nil {
		tb.Fatal(err)
	}
	objs := &v2pObjects{}
	if err := spec.LoadAndAssign(objs, nil); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { objs.Close() })
	self := netip.MustParseAddr("10.7.0.1")
	if err := objs.Ports.Update(uint32(1), v2pPort{Vni: 7, Ip: wireIP(self), Mac: [6]byte{0x52, 0x54, 0, 0, 0, 1}}, ebpf.UpdateAny); err != nil {
		tb.Fatal(err)
	}
	for ip, v := range map[string]v2pV2pValue{"10.7.0.2": {Host: hostIP(hostB)}, "10.7.0.3": {Host: hostIP(hostA), Ifindex: 1}} {
		if err := objs.V2p.Update(v2pV2pKey{Vni: 7, Ip: wireIP(netip.MustParseAddr(ip))}, v, ebpf.UpdateAny); err != nil {
			tb.Fatal(err)
		}
	}
	return objs
}

// FuzzFromGuest runs from_guest on arbitrary frames from a guest: every
// frame is dropped or redirected (none reaches the host's own stack), and
// an IPv4 frame is redirected only with the guest's own source address.
func FuzzFromGuest(f *testing.F) {
	objs := loadForTestRun(f)
	ipv4 := func(src, dst string) []byte {
		b := make([]byte, 14+20+8)
		binary.BigEndian.PutUint16(b[12:], 0x0800)
		b[14] = 0x45
		s, d := netip.MustParseAddr(src).As4(), netip.MustParseAddr(dst).As4()
		copy(b[26:], s[:])
		copy(b[30:], d[:])
		return b
	}
	arp := make([]byte, 14+28)
	binary.BigEndian.PutUint16(arp[12:], 0x0806)
	copy(arp[14:], []byte{0, 1, 8, 0, 6, 4, 0, 1})
	copy(arp[38:], []byte{10, 7, 0, 2})
	f.Add(ipv4("10.7.0.1", "10.7.0.2"))
	f.Add(ipv4("10.7.0.1", "10.7.0.3"))
	f.Add(ipv4("10.7.0.9", "10.7.0.2"))
	f.Add(ipv4("10.7.0.1", "10.99.0.1"))
	f.Add(arp)
	f.Add(make([]byte, 14))
	f.Fuzz(func(t *testing.T, frame []byte) {
		if len(frame) < 14 || len(frame) > 1514 {
			return // the kernel's test run wants an Ethernet header; a TAP's frame fits an MTU
		}
		ret, err := objs.FromGuest.Run(&ebpf.RunOptions{Data: frame})
		if errors.Is(err, unix.EINVAL) {
			return // the kernel's test run refuses it (an IPv6 frame shorter than its header)
		}
		if err != nil {
			t.Fatalf("running from_guest: %v", err)
		}
		if ret != tcActShot && ret != tcActRedirect {
			t.Fatalf("from_guest returned %d for % x: want drop or redirect", ret, frame)
		}
		ethertype := binary.BigEndian.Uint16(frame[12:])
		if ret == tcActRedirect && ethertype == 0x0800 {
			if len(frame) < 34 || netip.AddrFrom4([4]byte(frame[26:30])) != netip.MustParseAddr("10.7.0.1") {
				t.Fatalf("from_guest redirected a frame not from its guest: % x", frame)
			}
		}
		if ret == tcActRedirect && ethertype != 0x0800 && ethertype != 0x0806 {
			t.Fatalf("from_guest redirected ethertype %#04x", ethertype)
		}
	})
}

// TestFromGuestVerdicts runs from_guest on one frame of each kind and
// checks the verdict and the counter it bumps.
func TestFromGuestVerdicts(t *testing.T) {
	objs := loadForTestRun(t)
	p := &Plane{objs: *objs}
	frame := func(ethertype uint16, src, dst string) []byte {
		b := make([]byte, 14+20+8)
		binary.BigEndian.PutUint16(b[12:], ethertype)
		b[14] = 0x45
		s, d := netip.MustParseAddr(src).As4(), netip.MustParseAddr(dst).As4()
		copy(b[26:], s[:])
		copy(b[30:], d[:])
		return b
	}
	for _, c := range []struct {
		name    string
		frame   []byte
		verdict uint32
		counter Counter
	}{
		{"to a remote VM", frame(0x0800, "10.7.0.1", "10.7.0.2"), tcActRedirect, CounterEncapsulated},
		{"to a local VM", frame(0x0800, "10.7.0.1", "10.7.0.3"), tcActRedirect, CounterLocal},
		{"to no VM", frame(0x0800, "10.7.0.1", "10.7.0.4"), tcActShot, CounterDropNoMapping},
		{"spoofed", frame(0x0800, "10.7.0.5", "10.7.0.2"), tcActShot, CounterDropSpoofed},
		{"IPv6", append(frame(0x86dd, "10.7.0.1", "10.7.0.2"), make([]byte, 40)...), tcActShot, CounterDropNotIPv4},
		{"IPv4 header length 4", func() []byte { b := frame(0x0800, "10.7.0.1", "10.7.0.2"); b[14] = 0x44; return b }(), tcActShot, CounterDropMalformed},
	} {
		before, err := p.Counters()
		if err != nil {
			t.Fatal(err)
		}
		ret, err := objs.FromGuest.Run(&ebpf.RunOptions{Data: c.frame})
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		after, err := p.Counters()
		if err != nil {
			t.Fatal(err)
		}
		if ret != c.verdict || after[c.counter] != before[c.counter]+1 {
			t.Errorf("%s: verdict %d, %s +%d; want %d and +1", c.name, ret, c.counter, after[c.counter]-before[c.counter], c.verdict)
		}
	}
}
