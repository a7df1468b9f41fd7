// Package taptest gives tests real TAP interfaces in a network namespace
// of their own, and a raw packet socket on the host side of a TAP to send
// and receive exact Ethernet frames. Test tooling only.
package taptest

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"tern/vmm/tap"
)

// Netns is a network namespace a test made, with IPv6 off so that the
// kernel sends nothing unasked (no router solicitations or MLD reports)
// on the interfaces in it. It is deleted when the test ends.
type Netns struct {
	Name string
	h    netns.NsHandle
}

// New makes a namespace, or skips the test where it cannot (not root, no
// `ip`, no /dev/net/tun).
func New(t testing.TB) *Netns {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("TAP tests need root (network namespaces and /dev/net/tun)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("TAP tests need iproute2's ip: ", err)
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		t.Skip("TAP tests need /dev/net/tun: ", err)
	}
	b := make([]byte, 4)
	rand.Read(b)
	n := &Netns{Name: "ttap" + hex.EncodeToString(b), h: -1}
	run(t, "ip", "netns", "add", n.Name)
	t.Cleanup(func() {
		if n.h.IsOpen() {
			n.h.Close()
		}
		if out, err := exec.Command("ip", "netns", "delete", n.Name).CombinedOutput(); err != nil {
			t.Errorf("deleting network namespace %s: %v: %s", n.Name, err, out)
		}
	})
	run(t, "ip", "netns", "exec", n.Name, "sysctl", "-q", "-w",
		"net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1")
	run(t, "ip", "-n", n.Name, "link", "set", "lo", "up")
	h, err := netns.GetFromName(n.Name)
	if err != nil {
		t.Fatalf("opening network namespace %s: %v", n.Name, err)
	}
	n.h = h
	return n
}

func run(t testing.TB, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
}

// Do runs fn on a thread inside the namespace. Sockets and TAPs fn
// creates belong to the namespace; the fds work from any thread after.
func (n *Netns) Do(fn func() error) error {
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("reading the thread's network namespace: %w", err)
	}
	defer orig.Close()
	if err := netns.Set(n.h); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("entering network namespace %s: %w", n.Name, err)
	}
	ferr := fn()
	if err := netns.Set(orig); err != nil {
		// The thread stays locked and so dies with this goroutine
		// rather than serve others in the wrong namespace.
		return errors.Join(ferr, fmt.Errorf("leaving network namespace %s: %w", n.Name, err))
	}
	runtime.UnlockOSThread()
	return ferr
}

// OpenTAP creates the TAP interface name in the namespace, sets it up and
// returns it open; it is closed when the test ends.
func (n *Netns) OpenTAP(t testing.TB, name string) *tap.Device {
	t.Helper()
	var d *tap.Device
	if err := n.Do(func() (err error) { d, err = tap.Open(name); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	n.Up(t, name)
	return d
}

// Up sets the interface ifname of the namespace up (a TAP a VM created
// starts down).
func (n *Netns) Up(t testing.TB, ifname string) {
	t.Helper()
	run(t, "ip", "-n", n.Name, "link", "set", ifname, "up")
}

// Peer is a raw packet socket bound to one interface of a namespace: what
// it sends leaves by that interface (into a TAP's reader); it receives
// what arrives on it (what a TAP's writer sent).
type Peer struct {
	f       *os.File
	ifindex int
}

// Peer opens a packet socket on the interface ifname of the namespace;
// it is closed when the test ends.
func (n *Netns) Peer(t testing.TB, ifname string) *Peer {
	t.Helper()
	p := &Peer{}
	err := n.Do(func() error {
		ifi, err := net.InterfaceByName(ifname)
		if err != nil {
			return fmt.Errorf("finding interface %s: %w", ifname, err)
		}
		p.ifindex = ifi.Index
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ALL)))
		if err != nil {
			return fmt.Errorf("opening a packet socket: %w", err)
		}
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifi.Index}); err != nil {
			unix.Close(fd)
			return fmt.Errorf("binding a packet socket to %s: %w", ifname, err)
		}
		p.f = os.NewFile(uintptr(fd), "packet:"+ifname)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.f.Close() })
	return p
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// Send transmits frame on the interface.
func (p *Peer) Send(frame []byte) error {
	rc, err := p.f.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	err = rc.Write(func(fd uintptr) bool {
		serr = unix.Sendto(int(fd), frame, 0, &unix.SockaddrLinklayer{Ifindex: p.ifindex, Halen: 6, Addr: [8]byte{frame[0], frame[1], frame[2], frame[3], frame[4], frame[5]}})
		return serr != unix.EAGAIN
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		return fmt.Errorf("sending a frame: %w", err)
	}
	return nil
}

// Receive returns the next frame that arrived on the interface and that
// match accepts (frames the host itself sent out of it are skipped),
// waiting until timeout; a timeout is an error naming what it waited for.
func (p *Peer) Receive(what string, match func([]byte) bool, timeout time.Duration) ([]byte, error) {
	rc, err := p.f.SyscallConn()
	if err != nil {
		return nil, err
	}
	p.f.SetReadDeadline(time.Now().Add(timeout))
	defer p.f.SetReadDeadline(time.Time{})
	buf := make([]byte, 65536)
	for {
		var n int
		var from unix.Sockaddr
		var rerr error
		err := rc.Read(func(fd uintptr) bool {
			n, from, rerr = unix.Recvfrom(int(fd), buf, 0)
			return rerr != unix.EAGAIN
		})
		if err == nil {
			err = rerr
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return nil, fmt.Errorf("waiting %v for %s on the TAP's host side: none came", timeout, what)
		}
		if err != nil {
			return nil, fmt.Errorf("receiving a frame: %w", err)
		}
		if ll, ok := from.(*unix.SockaddrLinklayer); ok && ll.Pkttype == unix.PACKET_OUTGOING {
			continue
		}
		if match(buf[:n]) {
			return append([]byte(nil), buf[:n]...), nil
		}
	}
}
