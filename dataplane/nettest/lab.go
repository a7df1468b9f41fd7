package nettest

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Netns is a named network namespace and a netlink handle inside it.
type Netns struct {
	Name string
	h    netns.NsHandle
	nl   *netlink.Handle
}

// Path is where the namespace is mounted (what dataplane.Config.Netns takes).
func (n *Netns) Path() string { return filepath.Join("/run/netns", n.Name) }

// Lab owns the namespaces it made.
type Lab struct {
	prefix string

	mu  sync.Mutex
	all []*Netns
}

// NewLab starts an empty laboratory whose names begin with a random prefix.
func NewLab() *Lab {
	b := make([]byte, 3)
	rand.Read(b)
	return &Lab{prefix: "tdp" + hex.EncodeToString(b)}
}

// Netns makes a namespace named after the laboratory and name, with lo up.
func (l *Lab) Netns(name string) (*Netns, error) {
	full := l.prefix + "-" + name
	if err := addNamed(full); err != nil {
		return nil, fmt.Errorf("adding network namespace %s: %w", full, err)
	}
	n := &Netns{Name: full, h: -1}
	l.mu.Lock()
	l.all = append(l.all, n)
	l.mu.Unlock()
	var err error
	if n.h, err = netns.GetFromName(full); err != nil {
		return nil, fmt.Errorf("opening network namespace %s: %w", full, err)
	}
	if n.nl, err = netlink.NewHandleAt(n.h, unix.NETLINK_ROUTE); err != nil { // not XFRM: a module on Debian's 6.1
		return nil, fmt.Errorf("opening netlink in %s: %w", full, err)
	}
	if err := n.Up("lo"); err != nil {
		return nil, err
	}
	return n, nil
}

// Close deletes every namespace (and so every device in it).
func (l *Lab) Close() error {
	l.mu.Lock()
	all := l.all
	l.all = nil
	l.mu.Unlock()
	var errs []error
	for _, n := range all {
		if n.nl != nil {
			n.nl.Close()
		}
		if n.h.IsOpen() {
			n.h.Close()
		}
		if err := netns.DeleteNamed(n.Name); err != nil {
			errs = append(errs, fmt.Errorf("deleting network namespace %s: %w", n.Name, err))
		}
	}
	return errors.Join(errs...)
}

// addNamed makes a network namespace mounted at /run/netns/name, as
// `ip netns add` does, without needing iproute2 (the emulated test host
// has none): a thread unshares into it (netns.NewNamed) and returns.
func addNamed(name string) error {
	return onThread(func() error {
		h, err := netns.NewNamed(name)
		if err == nil {
			h.Close()
		}
		return err
	})
}

// Veth makes a veth pair: aName in a, bName in b, both up with mtu.
func Veth(a *Netns, aName string, b *Netns, bName string, mtu int) error {
	v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: aName, MTU: mtu}, PeerName: bName,
		PeerNamespace: netlink.NsFd(int(b.h)), PeerMTU: uint32(mtu)}
	if err := a.nl.LinkAdd(v); err != nil {
		return fmt.Errorf("adding veth %s/%s: %w", aName, bName, err)
	}
	if err := a.Up(aName); err != nil {
		return err
	}
	return b.Up(bName)
}

// Up sets dev up.
func (n *Netns) Up(dev string) error {
	link, err := n.nl.LinkByName(dev)
	if err == nil {
		err = n.nl.LinkSetUp(link)
	}
	if err != nil {
		return fmt.Errorf("setting %s up in %s: %w", dev, n.Name, err)
	}
	return nil
}

// Down sets dev down.
func (n *Netns) Down(dev string) error {
	link, err := n.nl.LinkByName(dev)
	if err == nil {
		err = n.nl.LinkSetDown(link)
	}
	if err != nil {
		return fmt.Errorf("setting %s down in %s: %w", dev, n.Name, err)
	}
	return nil
}

// Addr adds the address p to dev.
func (n *Netns) Addr(dev string, p netip.Prefix) error {
	link, err := n.nl.LinkByName(dev)
	if err == nil {
		err = n.nl.AddrAdd(link, &netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), 32)}})
	}
	if err != nil {
		return fmt.Errorf("adding %v to %s in %s: %w", p, dev, n.Name, err)
	}
	return nil
}

// MAC sets dev's hardware address.
func (n *Netns) MAC(dev string, mac net.HardwareAddr) error {
	link, err := n.nl.LinkByName(dev)
	if err == nil {
		err = n.nl.LinkSetHardwareAddr(link, mac)
	}
	if err != nil {
		return fmt.Errorf("setting %s's mac in %s: %w", dev, n.Name, err)
	}
	return nil
}

// Route adds a route to dst via gw.
func (n *Netns) Route(dst netip.Prefix, gw netip.Addr) error {
	r := &netlink.Route{Dst: &net.IPNet{IP: dst.Addr().AsSlice(), Mask: net.CIDRMask(dst.Bits(), 32)}, Gw: gw.AsSlice()}
	if err := n.nl.RouteAdd(r); err != nil {
		return fmt.Errorf("adding route %v via %v in %s: %w", dst, gw, n.Name, err)
	}
	return nil
}

// Bridge makes a bridge dev, up.
func (n *Netns) Bridge(dev string) error {
	if err := n.nl.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: dev}}); err != nil {
		return fmt.Errorf("adding bridge %s in %s: %w", dev, n.Name, err)
	}
	return n.Up(dev)
}

// Enslave puts dev into bridge.
func (n *Netns) Enslave(dev, bridge string) error {
	link, err := n.nl.LinkByName(dev)
	if err != nil {
		return fmt.Errorf("finding %s in %s: %w", dev, n.Name, err)
	}
	br, err := n.nl.LinkByName(bridge)
	if err != nil {
		return fmt.Errorf("finding %s in %s: %w", bridge, n.Name, err)
	}
	if err := n.nl.LinkSetMaster(link, br); err != nil {
		return fmt.Errorf("enslaving %s to %s in %s: %w", dev, bridge, n.Name, err)
	}
	return nil
}

// Ifindex is dev's interface index.
func (n *Netns) Ifindex(dev string) (int, error) {
	link, err := n.nl.LinkByName(dev)
	if err != nil {
		return 0, fmt.Errorf("finding %s in %s: %w", dev, n.Name, err)
	}
	return link.Attrs().Index, nil
}

// Sysctl writes value to the namespace's /proc/sys/key (dots or slashes).
func (n *Netns) Sysctl(key, value string) error {
	path := filepath.Join("/proc/sys", strings.ReplaceAll(key, ".", "/"))
	return n.Do(func() error { return os.WriteFile(path, []byte(value), 0o644) })
}

// Do runs fn on a thread in the namespace: sockets fn opens stay there.
func (n *Netns) Do(fn func() error) error {
	return onThread(func() error {
		if err := netns.Set(n.h); err != nil {
			return fmt.Errorf("entering %s: %w", n.Name, err)
		}
		return fn()
	})
}

// onThread runs fn on a locked thread of its own, which may change its
// network namespace, and returns the thread to the namespace it had; a
// thread that cannot return stays locked and ends with its goroutine.
func onThread(fn func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("reading the thread's network namespace: %w", err)
			return
		}
		defer orig.Close()
		err = fn()
		if serr := netns.Set(orig); serr != nil {
			done <- errors.Join(err, fmt.Errorf("returning the thread to its network namespace: %w", serr))
			return
		}
		runtime.UnlockOSThread()
		done <- err
	}()
	return <-done
}

// Neighbor sets a permanent neighbour entry: ip is at mac on dev.
func (n *Netns) Neighbor(dev string, ip netip.Addr, mac net.HardwareAddr) error {
	ifindex, err := n.Ifindex(dev)
	if err != nil {
		return err
	}
	err = n.nl.NeighSet(&netlink.Neigh{LinkIndex: ifindex, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT,
		IP: ip.AsSlice(), HardwareAddr: mac})
	if err != nil {
		return fmt.Errorf("adding neighbour %v on %s in %s: %w", ip, dev, n.Name, err)
	}
	return nil
}
