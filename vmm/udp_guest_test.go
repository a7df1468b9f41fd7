package vmm_test

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"tern/dataplane/nettest"
	"tern/vmm"
	"tern/vmm/guests"
	"tern/vmm/kvm/kvmtest"
	"tern/vmm/tap/taptest"
)

// TestUDPGuestEchoesAndCountsOnItsCard runs the udp guest on a virtio-net
// card whose TAP the test plays the network on: a datagram to the echo
// port comes back with its addresses swapped, and numbered datagrams
// (one number left out, one sent twice) are counted as its report then
// says.
func TestUDPGuestEchoesAndCountsOnItsCard(t *testing.T) {
	kvmtest.Require(t)
	ns := taptest.New(t)
	var vm *vmm.VM
	if err := ns.Do(func() (err error) {
		vm, err = vmm.New(vmm.Config{Guest: "udp", MemoryBytes: 64 << 20, NICs: []vmm.NIC{{TAP: "tudp0"}}})
		return err
	}); err != nil {
		t.Fatalf("vmm.New: %v", err)
	}
	t.Cleanup(func() { vm.Close() })
	con := newConsole(t, vm)
	start(t, vm)
	guestMAC := vmm.NICMAC("tudp0")
	con.waitLine("udp: ready mac " + guestMAC.String())
	ns.Up(t, "tudp0")
	peer := ns.Peer(t, "tudp0")

	peerMAC := net.HardwareAddr{0x02, 0, 0, 0, 0, 9}
	guestIP, peerIP := netip.MustParseAddr("10.7.0.2"), netip.MustParseAddr("10.7.0.9")
	payload := []byte("echo me")
	if err := peer.Send(nettest.UDPFrame(guestMAC, peerMAC, netip.AddrPortFrom(peerIP, 4000),
		netip.AddrPortFrom(guestIP, guests.UDPEchoPort), payload)); err != nil {
		t.Fatal(err)
	}
	want := nettest.UDPFrame(peerMAC, guestMAC, netip.AddrPortFrom(guestIP, guests.UDPEchoPort),
		netip.AddrPortFrom(peerIP, 4000), payload)
	got, err := peer.Receive("the guest's echo", func(f []byte) bool {
		return len(f) > 12 && bytes.Equal(f[:6], peerMAC)
	}, generous)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("echo\n% x\nwant\n% x", got, want)
	}

	seq := []uint32{0, 1, 2, 3, 5, 6, 6, 7}
	for _, n := range seq {
		msg := binary.BigEndian.AppendUint32(nil, n)
		if err := peer.Send(nettest.UDPFrame(guestMAC, peerMAC, netip.AddrPortFrom(peerIP, 4001),
			netip.AddrPortFrom(guestIP, 9000), msg)); err != nil {
			t.Fatal(err)
		}
	}
	// Ask for reports until one counts every datagram sent: the guest
	// may not have polled the last ones yet.
	for request := uint32(1); ; request++ {
		if err := vm.Memory().AtomicPutUint32(guests.ParamsAddr+guests.VerifyRequestOffset, request); err != nil {
			t.Fatal(err)
		}
		lines := []string{con.waitFor("the udp guest's report", func(l string) bool { return strings.HasPrefix(l, guests.UDPReportFirstLine) })}
		for lines[len(lines)-1] != guests.UDPReportEnd {
			lines = append(lines, con.waitFor("the rest of the udp guest's report", func(string) bool { return true }))
		}
		r, err := guests.ParseUDPReport(lines)
		if err != nil {
			t.Fatal(err)
		}
		if r.Received < uint64(len(seq)) {
			if request == 100 {
				t.Fatalf("after %d reports the guest counted %+v; %d were sent", request, r, len(seq))
			}
			continue
		}
		want := guests.UDPReport{Received: 8, Distinct: 7, First: 0, Highest: 7, Gap: r.Gap, GapAfter: r.GapAfter, GapUntil: r.GapUntil,
			Stall: r.Stall, Missing: [][2]uint64{{4, 4}}}
		if !reflect.DeepEqual(r, want) || r.Lost() != 1 {
			t.Fatalf("report %+v (lost %d); want %+v, 4 lost", r, r.Lost(), want)
		}
		t.Logf("%+v", r)
		return
	}
}
