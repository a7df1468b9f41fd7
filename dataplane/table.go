package dataplane

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"
)

// Mapping is one virtual-to-physical entry: the VM (InstanceID) with the
// virtual IPv4 IP in network VNI is served by the host whose underlay
// IPv4 is Underlay.
type Mapping struct {
	VNI        uint32
	IP         netip.Addr
	InstanceID string
	Underlay   netip.Addr
}

// Port is a VM's network interface on this host: the TAP (or a veth
// standing in for it) named Device in the plane's network namespace,
// carrying the guest with MAC and the address IP in network VNI.
type Port struct {
	InstanceID string
	Device     string
	MAC        net.HardwareAddr
	VNI        uint32
	IP         netip.Addr
}

// maxVNI is the largest VXLAN network identifier (24 bits).
const maxVNI = 1<<24 - 1

func validVNI(vni uint32) error {
	if vni == 0 || vni > maxVNI {
		return fmt.Errorf("vni %d: want 1 to %d", vni, maxVNI)
	}
	return nil
}

// validateTable checks every mapping, returning every problem at once: a
// bad VNI or address, or two mappings for one (VNI, IP).
func validateTable(table []Mapping) error {
	var errs []error
	seen := map[v2pV2pKey]string{}
	for i, m := range table {
		if err := validVNI(m.VNI); err != nil {
			errs = append(errs, fmt.Errorf("mapping %d (%s): %w", i, m.InstanceID, err))
		}
		if !m.IP.Is4() {
			errs = append(errs, fmt.Errorf("mapping %d (%s): ip %v is not IPv4", i, m.InstanceID, m.IP))
		}
		if !m.Underlay.Is4() {
			errs = append(errs, fmt.Errorf("mapping %d (%s): underlay %v is not IPv4", i, m.InstanceID, m.Underlay))
		}
		if m.InstanceID == "" {
			errs = append(errs, fmt.Errorf("mapping %d: no instance id", i))
		}
		if m.IP.Is4() {
			k := v2pV2pKey{Vni: m.VNI, Ip: wireIP(m.IP)}
			if other, dup := seen[k]; dup {
				errs = append(errs, fmt.Errorf("mapping %d (%s): vni %d ip %v is also %s's", i, m.InstanceID, m.VNI, m.IP, other))
			}
			seen[k] = m.InstanceID
		}
	}
	return errors.Join(errs...)
}

func (p Port) validate() error {
	var errs []error
	if p.InstanceID == "" {
		errs = append(errs, errors.New("no instance id"))
	}
	if p.Device == "" {
		errs = append(errs, errors.New("no device"))
	}
	if len(p.MAC) != 6 {
		errs = append(errs, fmt.Errorf("mac %v: want 6 bytes", p.MAC))
	}
	if err := validVNI(p.VNI); err != nil {
		errs = append(errs, err)
	}
	if !p.IP.Is4() {
		errs = append(errs, fmt.Errorf("ip %v is not IPv4", p.IP))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("port %s: %w", p.InstanceID, err)
	}
	return nil
}

// wireIP is an IPv4 address as the programs compare it: its network-order
// bytes read as a native uint32, the way a packet field loads.
func wireIP(a netip.Addr) uint32 {
	b := a.As4()
	return binary.NativeEndian.Uint32(b[:])
}

// hostIP is an IPv4 address in host byte order, as bpf_tunnel_key holds it.
func hostIP(a netip.Addr) uint32 {
	b := a.As4()
	return binary.BigEndian.Uint32(b[:])
}

func addrFromHost(v uint32) netip.Addr {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], v)
	return netip.AddrFrom4(b)
}

func addrFromWire(v uint32) netip.Addr {
	var b [4]byte
	binary.NativeEndian.PutUint32(b[:], v)
	return netip.AddrFrom4(b)
}

// v2pForward is the value flag V2P_FORWARD of bpf/v2p.c.
const v2pForward = 1

// attachedPort is a port as the planner sees it: where it is and what the
// guest behind it claims.
type attachedPort struct {
	Port
	ifindex uint32
}

// desiredEntries is the V2P map the table asks for on the host with
// underlay self: a remote entry for every VM elsewhere, and a local one
// for every VM here whose port is attached in the same VNI with the same
// address (a VM here without such a port gets no entry: its packets drop
// as having no mapping, as they would at a missing TAP).
func desiredEntries(table []Mapping, self netip.Addr, ports map[string]attachedPort) map[v2pV2pKey]v2pV2pValue {
	out := make(map[v2pV2pKey]v2pV2pValue, len(table))
	for _, m := range table {
		k := v2pV2pKey{Vni: m.VNI, Ip: wireIP(m.IP)}
		if m.Underlay != self {
			out[k] = v2pV2pValue{Host: hostIP(m.Underlay)}
			continue
		}
		p, ok := ports[m.InstanceID]
		if !ok || p.VNI != m.VNI || p.IP != m.IP {
			continue
		}
		out[k] = v2pV2pValue{Host: hostIP(self), Ifindex: p.ifindex}
	}
	return out
}

// update is one write to the V2P map; del removes key instead.
type update struct {
	key v2pV2pKey
	val v2pV2pValue
	del bool
}

// plan is what takes the kernel's V2P map from current to desired: the
// writes (every changed or new key, each one atomic map update) before the
// deletions (stale keys), so no key that stays is ever absent.
//
// A VM that stops being local here (its key was local in prev, the
// previous desired map, and is not in desired) is recorded in leftAt; for
// forwardFor after that, while desired maps it to another host, its entry
// carries V2P_FORWARD so packets still tunnelled here for it follow it.
// The order of the two events does not matter: the port may go first (the
// key disappears, then comes back remote) or the table may (local turns
// remote). leftAt is updated in place and loses what has expired.
func plan(prev, desired, current map[v2pV2pKey]v2pV2pValue, leftAt map[v2pV2pKey]time.Time, now time.Time, forwardFor time.Duration) []update {
	for k, was := range prev {
		if is := desired[k]; was.Ifindex != 0 && is.Ifindex == 0 {
			leftAt[k] = time.Time{}
		}
	}
	for k, t := range leftAt {
		switch {
		case t.IsZero():
			leftAt[k] = now
		case desired[k].Ifindex != 0 || !now.Before(t.Add(forwardFor)):
			delete(leftAt, k)
		}
	}
	var puts, dels []update
	for k, want := range desired {
		if _, moved := leftAt[k]; moved && want.Ifindex == 0 && forwardFor > 0 {
			want.Flags |= v2pForward
		}
		if have, had := current[k]; !had || have != want {
			puts = append(puts, update{key: k, val: want})
		}
	}
	for k := range current {
		if _, keep := desired[k]; !keep {
			dels = append(dels, update{key: k, del: true})
		}
	}
	return append(puts, dels...)
}

// nextDeadline is when the first forwarding entry in leftAt expires, or
// false if there is none.
func nextDeadline(leftAt map[v2pV2pKey]time.Time, forwardFor time.Duration) (time.Time, bool) {
	var first time.Time
	for _, t := range leftAt {
		if end := t.Add(forwardFor); first.IsZero() || end.Before(first) {
			first = end
		}
	}
	return first, !first.IsZero()
}
