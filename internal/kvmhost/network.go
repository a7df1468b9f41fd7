package kvmhost

import (
	"fmt"
	"strings"
)

// Addresses on the emulated host's network (QEMU user networking): the
// emulated host is GuestAddr; HostAddr is the host's loopback as seen
// from inside, so a server on the host's 127.0.0.1:PORT is
// HostAddr:PORT in there (TCP and UDP).
const (
	GuestAddr = "10.0.2.15"
	HostAddr  = "10.0.2.2"
	// guestPrefixLen is GuestAddr's prefix: HostAddr is on the link, so
	// no route is needed to reach it.
	guestPrefixLen = 24
	// guestNIC is the interface the e1000 driver names.
	guestNIC = "eth0"
)

// Network gives the emulated host a network card on QEMU user
// networking, configured by init as GuestAddr/24 on eth0, through which
// it reaches the host's loopback at HostAddr.
type Network struct {
	// Forwards make TCP ports on the host's 127.0.0.1 reach ports of the
	// emulated host.
	Forwards []Forward
}

// Forward carries connections to 127.0.0.1:HostPort on the host to
// GuestAddr:GuestPort inside.
type Forward struct {
	HostPort, GuestPort int
}

// qemuNetArgs are QEMU's arguments for n: a user-networking backend
// with n's forwards (host side bound to loopback only) and an e1000 card.
func qemuNetArgs(n *Network) []string {
	if n == nil {
		return nil
	}
	backend := []string{"user", "id=n0"}
	for _, f := range n.Forwards {
		backend = append(backend, fmt.Sprintf("hostfwd=tcp:127.0.0.1:%d-%s:%d", f.HostPort, GuestAddr, f.GuestPort))
	}
	return []string{"-netdev", strings.Join(backend, ","), "-device", "e1000,netdev=n0"}
}
