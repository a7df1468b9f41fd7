package dataplane_test

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"tern/dataplane"
	"tern/dataplane/nettest"
	"tern/dataplane/planetest"
)

var (
	vm7a  = vmSpec{"vm7a", 7, "10.7.0.1"}
	vm7b  = vmSpec{"vm7b", 7, "10.7.0.2"}
	vm7b2 = vmSpec{"vm7b2", 7, "10.7.0.4"}
	// vm8 shares 10.7/16 with the VNI-7 VMs: only the VNI keeps them apart.
	vm8 = vmSpec{"vm8", 8, "10.7.0.3"}
)

// twoHosts is hosts A (vm7a) and B (vm7b, vm7b2, vm8) with the table applied.
type twoHosts struct {
	rack               *nettest.Rack
	a, b               *nettest.Host
	pa, pb             *dataplane.Plane
	v7a, v7b, v7b2, v8 *nettest.VM
}

func newTwoHosts(t *testing.T, mode dataplane.AttachMode) *twoHosts {
	r := planetest.NewRack(t)
	w := &twoHosts{rack: r, a: planetest.AddHost(t, r, "a"), b: planetest.AddHost(t, r, "b")}
	w.pa, w.pb = planetest.NewPlane(t, w.a, mode), planetest.NewPlane(t, w.b, mode)
	w.v7a = addVM(t, r, w.a, w.pa, vm7a)
	w.v7b = addVM(t, r, w.b, w.pb, vm7b)
	w.v7b2 = addVM(t, r, w.b, w.pb, vm7b2)
	w.v8 = addVM(t, r, w.b, w.pb, vm8)
	planetest.Apply(t, []dataplane.Mapping{mapping(vm7a, w.a), mapping(vm7b, w.b), mapping(vm7b2, w.b), mapping(vm8, w.b)}, w.pa, w.pb)
	return w
}

func TestUDPEchoAndPingAcrossHostsInOneVNI(t *testing.T) {
	for _, mode := range []struct {
		name string
		mode dataplane.AttachMode
	}{{"tcx", dataplane.AttachTCX}, {"tc-filter", dataplane.AttachTC}} {
		t.Run(mode.name, func(t *testing.T) {
			w := newTwoHosts(t, mode.mode)
			echo(t, w.v7b, 7000)
			echo(t, w.v7b2, 7000)
			beforeA, beforeB := planetest.Counters(t, w.pa), planetest.Counters(t, w.pb)
			c := planetest.UDPConn(t, w.v7a, 7001)
			for i := range 10 {
				if err := nettest.RoundTrip(c, netip.AddrPortFrom(w.v7b.IP, 7000), fmt.Appendf(nil, "datagram %d", i), 20*time.Second); err != nil {
					t.Fatalf("across hosts: %v", err)
				}
			}
			if err := w.v7a.NS.Ping(w.v7b.IP, 20*time.Second); err != nil {
				t.Fatalf("across hosts: %v", err)
			}
			// On one host: B's two VNI-7 VMs.
			cb := planetest.UDPConn(t, w.v7b, 7001)
			if err := nettest.RoundTrip(cb, netip.AddrPortFrom(w.v7b2.IP, 7000), []byte("next door"), 20*time.Second); err != nil {
				t.Fatalf("on one host: %v", err)
			}
			if err := w.v7b2.NS.Ping(w.v7b.IP, 20*time.Second); err != nil {
				t.Fatalf("on one host: %v", err)
			}
			afterA, afterB := planetest.Counters(t, w.pa), planetest.Counters(t, w.pb)
			for _, want := range []struct {
				name  string
				got   uint64
				least uint64
			}{
				{"A encapsulated", afterA[dataplane.CounterEncapsulated] - beforeA[dataplane.CounterEncapsulated], 11},
				{"A delivered", afterA[dataplane.CounterDelivered] - beforeA[dataplane.CounterDelivered], 11},
				{"A arp replied", afterA[dataplane.CounterARPReplied] - beforeA[dataplane.CounterARPReplied], 1},
				{"B delivered", afterB[dataplane.CounterDelivered] - beforeB[dataplane.CounterDelivered], 11},
				{"B encapsulated", afterB[dataplane.CounterEncapsulated] - beforeB[dataplane.CounterEncapsulated], 11},
				{"B local", afterB[dataplane.CounterLocal] - beforeB[dataplane.CounterLocal], 4},
			} {
				if want.got < want.least {
					t.Errorf("%s: %d packets, want at least %d (A %v, B %v)", want.name, want.got, want.least, afterA, afterB)
				}
			}
		})
	}
}
