package dataplane_test

import (
	"net"
	"net/netip"
	"testing"

	"tern/dataplane"
	"tern/dataplane/nettest"
)

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

func echo(t *testing.T, vm *nettest.VM, port uint16) {
	t.Helper()
	e, err := vm.NS.StartEcho(netip.AddrPortFrom(vm.IP, port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
}
