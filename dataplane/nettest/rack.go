package nettest

import (
	"fmt"
	"net"
	"net/netip"
)

// VMMTU is the MTU of every VM interface: 1500 less VXLAN's 50 bytes, so
// an encapsulated frame fits the underlay's 1500.
const VMMTU = 1450

// Rack is hosts on one underlay segment, 10.99.0.0/24, a bridge in a
// namespace of its own playing the top-of-rack switch.
type Rack struct {
	Lab   *Lab
	sw    *Netns
	Hosts []*Host
}

// Host is a host's namespace and its underlay address (on device ul0).
type Host struct {
	NS       *Netns
	Underlay netip.Addr
	index    int
}

// VM is a VM stand-in: a namespace whose eth0 has IP and MAC, the peer of
// Device in its host's namespace (what the VM's TAP would be).
type VM struct {
	NS     *Netns
	Host   *Host
	IP     netip.Addr
	MAC    net.HardwareAddr
	Device string
	// Plain is the VM's address on the plain routed path (AddPlainPath).
	Plain netip.Addr
}

// NewRack makes the switch of a rack in lab.
func NewRack(lab *Lab) (*Rack, error) {
	sw, err := lab.Netns("sw")
	if err != nil {
		return nil, err
	}
	if err := sw.Bridge("br0"); err != nil {
		return nil, err
	}
	return &Rack{Lab: lab, sw: sw}, nil
}

// AddHost adds a host namespace with underlay 10.99.0.N (N = hosts so far + 1).
func (r *Rack) AddHost(name string) (*Host, error) {
	ns, err := r.Lab.Netns(name)
	if err != nil {
		return nil, err
	}
	i := len(r.Hosts)
	h := &Host{NS: ns, Underlay: netip.AddrFrom4([4]byte{10, 99, 0, byte(i + 1)}), index: i}
	port := fmt.Sprintf("h%d", i)
	if err := Veth(ns, "ul0", r.sw, port, 1500); err != nil {
		return nil, err
	}
	if err := r.sw.Enslave(port, "br0"); err != nil {
		return nil, err
	}
	if err := ns.Addr("ul0", netip.PrefixFrom(h.Underlay, 24)); err != nil {
		return nil, err
	}
	if err := ns.Sysctl("net.ipv6.conf.all.disable_ipv6", "1"); err != nil {
		return nil, err
	}
	r.Hosts = append(r.Hosts, h)
	return h, nil
}

// AddVM adds a VM stand-in on h: namespace name, eth0 with ip/16 and mac,
// its peer "v-"+name in h's namespace.
func (r *Rack) AddVM(h *Host, name string, ip netip.Addr, mac net.HardwareAddr) (*VM, error) {
	ns, err := r.Lab.Netns(name)
	if err != nil {
		return nil, err
	}
	vm := &VM{NS: ns, Host: h, IP: ip, MAC: mac, Device: "v-" + name}
	if len(vm.Device) > 15 {
		return nil, fmt.Errorf("vm name %q: at most 13 bytes", name)
	}
	if err := ns.Sysctl("net.ipv6.conf.all.disable_ipv6", "1"); err != nil {
		return nil, err
	}
	if err := Veth(h.NS, vm.Device, ns, "eth0", VMMTU); err != nil {
		return nil, err
	}
	if err := ns.MAC("eth0", mac); err != nil {
		return nil, err
	}
	if err := ns.Addr("eth0", netip.PrefixFrom(ip, 16)); err != nil {
		return nil, err
	}
	return vm, nil
}

// AddPlainPath gives vm a second interface, plain0, routed by its host
// with no data plane on it: 172.30.H.N/24 behind 172.30.H.1 on host H.
// RoutePlain then joins the hosts' plain subnets over the underlay.
func (r *Rack) AddPlainPath(vm *VM, n byte) error {
	h := vm.Host
	dev := "p-" + vm.NS.Name[len(r.Lab.prefix)+1:]
	if len(dev) > 15 {
		return fmt.Errorf("device name %q too long", dev)
	}
	gw := netip.AddrFrom4([4]byte{172, 30, byte(h.index), 1})
	vm.Plain = netip.AddrFrom4([4]byte{172, 30, byte(h.index), n})
	if err := Veth(h.NS, dev, vm.NS, "plain0", VMMTU); err != nil {
		return err
	}
	if err := h.NS.Addr(dev, netip.PrefixFrom(gw, 24)); err != nil {
		return err
	}
	if err := vm.NS.Addr("plain0", netip.PrefixFrom(vm.Plain, 24)); err != nil {
		return err
	}
	return vm.NS.Route(netip.MustParsePrefix("172.30.0.0/16"), gw)
}

// RoutePlain turns on forwarding in every host and routes each host's
// plain subnet via its underlay address.
func (r *Rack) RoutePlain() error {
	for _, h := range r.Hosts {
		if err := h.NS.Sysctl("net.ipv4.ip_forward", "1"); err != nil {
			return err
		}
		for _, o := range r.Hosts {
			if o == h {
				continue
			}
			if err := h.NS.Route(netip.PrefixFrom(netip.AddrFrom4([4]byte{172, 30, byte(o.index), 0}), 24), o.Underlay); err != nil {
				return err
			}
		}
	}
	return nil
}
