package dataplane_test

import (
	"net/netip"
	"testing"
	"time"

	"tern/dataplane"
	"tern/dataplane/nettest"
	"tern/dataplane/planetest"
)

// TestIsolationVNI8CannotReachVNI7 checks the VNI boundary on every path:
// the VNI-8 VM gets no ARP answer for VNI-7 addresses, its packets to them
// (local and remote) are dropped at its port, so is a VXLAN packet it
// forges for VNI 7 and one with a spoofed source; and packets forged on
// the underlay with a VNI that does not own the inner destination are
// dropped at the tunnel. Every drop is counted; VNI-7 traffic still flows.
func TestIsolationVNI8CannotReachVNI7(t *testing.T) {
	w := newTwoHosts(t, dataplane.AttachAuto)
	echo(t, w.v7a, 7000)
	echo(t, w.v7b, 7000)

	t.Run("no ARP answer across VNIs", func(t *testing.T) {
		before := planetest.Counters(t, w.pb)
		c := planetest.UDPConn(t, w.v8, 7001)
		// The kernel ARPs for 10.7.0.2 first; nothing answers in VNI 8.
		c.WriteToUDPAddrPort([]byte("hello?"), netip.AddrPortFrom(w.v7b.IP, 7000))
		planetest.WaitCounter(t, w.pb, before, dataplane.CounterDropARP, 1)
	})

	// With the neighbour entries set by hand, vm8 sends real IPv4 packets.
	for _, peer := range []*nettest.VM{w.v7a, w.v7b} {
		if err := w.v8.NS.Neighbor("eth0", peer.IP, dataplane.DefaultRouterMAC); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("UDP and ping to VNI 7 dropped", func(t *testing.T) {
		before := planetest.Counters(t, w.pb)
		c := planetest.UDPConn(t, w.v8, 7002)
		for _, peer := range []*nettest.VM{w.v7a, w.v7b} {
			for range 5 {
				if _, err := c.WriteToUDPAddrPort([]byte("from vni 8"), netip.AddrPortFrom(peer.IP, 7000)); err != nil {
					t.Fatal(err)
				}
			}
			if err := w.v8.NS.Ping(peer.IP, 300*time.Millisecond); err == nil {
				t.Errorf("vm8 (VNI 8) pinged %v (VNI 7)", peer.IP)
			}
		}
		planetest.WaitCounter(t, w.pb, before, dataplane.CounterDropNoMapping, 12)
		after := planetest.Counters(t, w.pb)
		if n := after[dataplane.CounterLocal] - before[dataplane.CounterLocal]; n != 0 {
			t.Errorf("%d packets went from a port to a local VM", n)
		}
		if n := after[dataplane.CounterEncapsulated] - before[dataplane.CounterEncapsulated]; n != 0 {
			t.Errorf("%d packets were encapsulated", n)
		}
	})

	inner := func(vni7dst netip.Addr) []byte {
		return nettest.UDPFrame(w.v7a.MAC, dataplane.DefaultRouterMAC, netip.AddrPortFrom(w.v7b.IP, 7000),
			netip.AddrPortFrom(vni7dst, 7000), []byte("forged"))
	}
	t.Run("VXLAN packet forged by the VNI-8 VM dropped at its port", func(t *testing.T) {
		before := planetest.Counters(t, w.pb)
		beforeA := planetest.Counters(t, w.pa)
		forged := nettest.UDPFrame(dataplane.DefaultRouterMAC, w.v8.MAC, netip.AddrPortFrom(w.v8.IP, 4789),
			netip.AddrPortFrom(w.a.Underlay, 4789), nettest.VXLANPayload(7, inner(w.v7a.IP)))
		if err := w.v8.NS.SendFrame("eth0", forged); err != nil {
			t.Fatal(err)
		}
		planetest.WaitCounter(t, w.pb, before, dataplane.CounterDropNoMapping, 1)
		if after := planetest.Counters(t, w.pa); after[dataplane.CounterDelivered] != beforeA[dataplane.CounterDelivered] {
			t.Errorf("host A delivered %d tunnelled packets", after[dataplane.CounterDelivered]-beforeA[dataplane.CounterDelivered])
		}
	})
	t.Run("spoofed source dropped", func(t *testing.T) {
		before := planetest.Counters(t, w.pb)
		spoofed := nettest.UDPFrame(dataplane.DefaultRouterMAC, w.v8.MAC, netip.AddrPortFrom(w.v7b2.IP, 7000),
			netip.AddrPortFrom(w.v7b.IP, 7000), []byte("not me"))
		if err := w.v8.NS.SendFrame("eth0", spoofed); err != nil {
			t.Fatal(err)
		}
		planetest.WaitCounter(t, w.pb, before, dataplane.CounterDropSpoofed, 1)
	})
	t.Run("outer header forged on the underlay dropped at the tunnel", func(t *testing.T) {
		before := planetest.Counters(t, w.pb)
		// From host A's namespace (a host, not a guest): VNI 8 claiming
		// vm7b, and VNI 7 claiming vm8's address.
		c, err := w.a.NS.ListenUDP(netip.AddrPortFrom(w.a.Underlay, 4800))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		to := netip.AddrPortFrom(w.b.Underlay, 4789)
		for _, f := range [][]byte{nettest.VXLANPayload(8, inner(w.v7b.IP)), nettest.VXLANPayload(7, inner(w.v8.IP))} {
			if _, err := c.WriteToUDPAddrPort(f, to); err != nil {
				t.Fatal(err)
			}
		}
		planetest.WaitCounter(t, w.pb, before, dataplane.CounterDropNotLocal, 2)
		if after := planetest.Counters(t, w.pb); after[dataplane.CounterDelivered] != before[dataplane.CounterDelivered] {
			t.Errorf("host B delivered %d forged packets", after[dataplane.CounterDelivered]-before[dataplane.CounterDelivered])
		}
	})
	t.Run("VNI 7 still flows", func(t *testing.T) {
		c := planetest.UDPConn(t, w.v7a, 7003)
		if err := nettest.RoundTrip(c, netip.AddrPortFrom(w.v7b.IP, 7000), []byte("still here"), 20*time.Second); err != nil {
			t.Fatal(err)
		}
	})
}
