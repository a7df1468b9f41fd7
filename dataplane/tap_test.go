package dataplane_test

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	"tern/dataplane"
	"tern/dataplane/nettest"
	"tern/dataplane/planetest"
)

// TestTAPGuestReachesAVMOnAnotherHost plays the guest on a real TAP, as a
// VMM's virtio-net backend sees it: the test writes the guest's frames to
// the TAP's file and reads what the data plane delivers. The guest's ARP
// request is answered with the router MAC, and its UDP datagram to vm7b on
// host B comes back from B's echo server, rewritten to the guest's MAC.
func TestTAPGuestReachesAVMOnAnotherHost(t *testing.T) {
	w := newTwoHosts(t, dataplane.AttachAuto)
	echo(t, w.v7b, 7000)
	tap, err := w.a.NS.OpenTAP("tap-guest")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tap.Close() })
	guest := vmSpec{"tapguest", 7, "10.7.0.5"}
	guestMAC := mac(5)
	guestIP := netip.MustParseAddr(guest.ip)
	if err := w.pa.AttachPort(dataplane.Port{InstanceID: guest.name, Device: "tap-guest", MAC: guestMAC, VNI: 7, IP: guestIP}); err != nil {
		t.Fatal(err)
	}
	planetest.Apply(t, []dataplane.Mapping{mapping(vm7a, w.a), mapping(vm7b, w.b), mapping(vm7b2, w.b), mapping(vm8, w.b), mapping(guest, w.a)}, w.pa, w.pb)

	// read returns the next frame the guest receives that match accepts.
	read := func(what string, match func([]byte) bool) []byte {
		t.Helper()
		tap.SetReadDeadline(time.Now().Add(20 * time.Second))
		buf := make([]byte, 2048)
		for {
			n, err := tap.Read(buf)
			if err != nil {
				t.Fatalf("waiting for %s on the TAP: %v", what, err)
			}
			if match(buf[:n]) {
				return append([]byte(nil), buf[:n]...)
			}
		}
	}

	arp := make([]byte, 42)
	copy(arp[0:], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	copy(arp[6:], guestMAC)
	binary.BigEndian.PutUint16(arp[12:], 0x0806)
	copy(arp[14:], []byte{0, 1, 8, 0, 6, 4, 0, 1})
	copy(arp[22:], guestMAC)
	g4, peer4 := guestIP.As4(), w.v7b.IP.As4()
	copy(arp[28:], g4[:])
	copy(arp[38:], peer4[:])
	if _, err := tap.Write(arp); err != nil {
		t.Fatal(err)
	}
	reply := read("the ARP reply", func(f []byte) bool {
		return len(f) >= 42 && binary.BigEndian.Uint16(f[12:]) == 0x0806 && binary.BigEndian.Uint16(f[20:]) == 2
	})
	if !bytes.Equal(reply[22:28], dataplane.DefaultRouterMAC) || !bytes.Equal(reply[28:32], peer4[:]) || !bytes.Equal(reply[0:6], guestMAC) {
		t.Fatalf("ARP reply % x: want %v is-at %v, to the guest", reply, w.v7b.IP, dataplane.DefaultRouterMAC)
	}

	payload := []byte("from a TAP guest")
	frame := nettest.UDPFrame(dataplane.DefaultRouterMAC, guestMAC, netip.AddrPortFrom(guestIP, 5555),
		netip.AddrPortFrom(w.v7b.IP, 7000), payload)
	if _, err := tap.Write(frame); err != nil {
		t.Fatal(err)
	}
	back := read("the echo", func(f []byte) bool {
		return len(f) >= 42 && binary.BigEndian.Uint16(f[12:]) == 0x0800 && f[23] == 17 &&
			binary.BigEndian.Uint16(f[36:]) == 5555 && bytes.Equal(f[42:], payload)
	})
	if !bytes.Equal(back[0:6], guestMAC) || !bytes.Equal(back[6:12], dataplane.DefaultRouterMAC) || !bytes.Equal(back[26:30], peer4[:]) {
		t.Fatalf("echo frame % x: want from %v via the router MAC to the guest's MAC", back[:42], w.v7b.IP)
	}
}
