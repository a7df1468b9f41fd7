package chaos

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// ErrNotSupported is wrapped by NewNetwork's error when this machine does
// not let the caller create network namespaces; tests skip on it.
var ErrNotSupported = errors.New("network namespaces not supported here")

// Subnet is the private IPv4 /24 every Network uses for its hosts. It only
// ever exists inside a Network's own namespaces (the bridge lives in a
// namespace of its own, not the root one), so networks never meet each
// other or anything outside.
const Subnet = "10.213.0.0/24"

// networkCount numbers the networks this process creates, for unique
// namespace names.
var networkCount atomic.Int64

// Network is a set of hosts, each a network namespace with one veth
// interface (eth0) at 10.213.0.N, joined by a bridge in a switch
// namespace of its own. Links are cut and healed per host with tc-bpf drop
// filters on the host's eth0.
type Network struct {
	prefix string // namespace names start with it
	sw     string // the switch namespace
	hosts  []*Host
}

// Host is one namespace of a Network.
type Host struct {
	// Name is the host's name within the network; NS its namespace.
	Name string
	NS   string
	IP   net.IP
	cut  Direction
}

// Direction says which traffic of a host a cut drops.
type Direction uint8

// Directions of a cut: what reaches the host, what leaves it, or both.
const (
	Inbound Direction = 1 << iota
	Outbound
	Both = Inbound | Outbound
)

func (d Direction) String() string {
	switch d {
	case Inbound:
		return "inbound"
	case Outbound:
		return "outbound"
	case Both:
		return "both ways"
	}
	return "none"
}

// dropAll is a classic BPF program, "ret #2": in direct-action mode tc
// reads 2 as TC_ACT_SHOT and drops the packet. It needs only cls_bpf,
// where this kernel has neither matchall, the gact action nor netem.
const dropAll = "1,6 0 0 2,"

// NewNetwork creates the switch namespace and its bridge, then one host
// per name, at 10.213.0.1, .2, … in order. The error wraps ErrNotSupported
// when namespaces cannot be made here (not root, no ip or tc, a kernel
// without them), saying which.
func NewNetwork(names ...string) (_ *Network, err error) {
	if err := probe(); err != nil {
		return nil, err
	}
	removeStale()
	n := &Network{prefix: fmt.Sprintf("tern-chaos-%d-%d-", os.Getpid(), networkCount.Add(1))}
	n.sw = n.prefix + "switch"
	defer func() {
		if err != nil {
			n.Close()
		}
	}()
	if err := run("ip", "netns", "add", n.sw); err != nil {
		return nil, fmt.Errorf("creating switch namespace: %w", err)
	}
	for _, args := range [][]string{
		{"link", "add", "br0", "type", "bridge"},
		{"link", "set", "br0", "up"},
	} {
		if err := run("ip", append([]string{"-n", n.sw}, args...)...); err != nil {
			return nil, fmt.Errorf("creating bridge: %w", err)
		}
	}
	for i, name := range names {
		h := &Host{Name: name, NS: n.prefix + name, IP: net.IPv4(10, 213, 0, byte(i+1))}
		if err := n.addHost(h, i); err != nil {
			return nil, fmt.Errorf("creating host %s: %w", name, err)
		}
	}
	return n, nil
}

func (n *Network) addHost(h *Host, i int) error {
	if err := run("ip", "netns", "add", h.NS); err != nil {
		return err
	}
	n.hosts = append(n.hosts, h)
	port := "p" + strconv.Itoa(i)
	steps := [][]string{
		{"ip", "link", "add", "eth0", "netns", h.NS, "type", "veth", "peer", "name", port, "netns", n.sw},
		{"ip", "-n", n.sw, "link", "set", port, "master", "br0", "up"},
		{"ip", "-n", h.NS, "addr", "add", h.IP.String() + "/24", "dev", "eth0"},
		{"ip", "-n", h.NS, "link", "set", "eth0", "up"},
		{"ip", "-n", h.NS, "link", "set", "lo", "up"},
		{"ip", "netns", "exec", h.NS, "tc", "qdisc", "add", "dev", "eth0", "clsact"},
	}
	for _, s := range steps {
		if err := run(s[0], s[1:]...); err != nil {
			return err
		}
	}
	return nil
}

// Hosts are the network's hosts in the order they were named.
func (n *Network) Hosts() []*Host { return n.hosts }

// Host returns the host called name, or nil.
func (n *Network) Host(name string) *Host {
	for _, h := range n.hosts {
		if h.Name == name {
			return h
		}
	}
	return nil
}

// Close deletes every namespace, which removes their links. Processes
// still running in a host keep its namespace alive until they exit: stop
// them first.
func (n *Network) Close() error {
	var errs []error
	for _, h := range n.hosts {
		if err := run("ip", "netns", "del", h.NS); err != nil {
			errs = append(errs, err)
		}
	}
	n.hosts = nil
	if n.sw != "" {
		if err := run("ip", "netns", "del", n.sw); err != nil {
			errs = append(errs, err)
		}
		n.sw = ""
	}
	return errors.Join(errs...)
}

// Command runs name in the host's namespace (through `ip netns exec`,
// which execs it: the process's PID is the command's own).
func (h *Host) Command(name string, args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", h.NS, name}, args...)...)
}

// Cut drops the host's traffic in direction d (on top of any cut already
// in place) until Heal.
func (h *Host) Cut(d Direction) error {
	for _, hook := range []struct {
		dir  Direction
		name string
	}{{Inbound, "ingress"}, {Outbound, "egress"}} {
		if d&hook.dir == 0 || h.cut&hook.dir != 0 {
			continue
		}
		if err := run("ip", "netns", "exec", h.NS, "tc", "filter", "add", "dev", "eth0", hook.name,
			"pref", "1", "bpf", "da", "bytecode", dropAll); err != nil {
			return fmt.Errorf("cutting %s %s: %w", h.Name, hook.dir, err)
		}
		h.cut |= hook.dir
	}
	return nil
}

// Heal removes every cut of the host.
func (h *Host) Heal() error {
	for _, hook := range []struct {
		dir  Direction
		name string
	}{{Inbound, "ingress"}, {Outbound, "egress"}} {
		if h.cut&hook.dir == 0 {
			continue
		}
		if err := run("ip", "netns", "exec", h.NS, "tc", "filter", "del", "dev", "eth0", hook.name); err != nil {
			return fmt.Errorf("healing %s %s: %w", h.Name, hook.dir, err)
		}
		h.cut &^= hook.dir
	}
	return nil
}

// ListenUDP opens a UDP socket bound to addr inside the host's namespace
// and returns it to this process: a socket stays in the namespace it was
// created in. The calling goroutine's thread is switched into the
// namespace just for the socket call, on a thread of its own that is
// thrown away if switching back fails.
func (h *Host) ListenUDP(addr *net.UDPAddr) (*net.UDPConn, error) {
	type result struct {
		c   *net.UDPConn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		c, restored, err := listenUDPIn(h.NS, addr)
		if restored {
			runtime.UnlockOSThread()
		} // else the thread, in the wrong namespace, dies with this goroutine
		ch <- result{c, err}
	}()
	r := <-ch
	return r.c, r.err
}

func listenUDPIn(ns string, addr *net.UDPAddr) (c *net.UDPConn, restored bool, err error) {
	orig, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
	if err != nil {
		return nil, true, fmt.Errorf("opening current namespace: %w", err)
	}
	defer orig.Close()
	target, err := os.Open("/var/run/netns/" + ns)
	if err != nil {
		return nil, true, fmt.Errorf("opening namespace %s: %w", ns, err)
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		return nil, true, fmt.Errorf("entering namespace %s: %w", ns, err)
	}
	c, err = net.ListenUDP("udp", addr)
	if serr := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); serr != nil {
		if c != nil {
			c.Close()
		}
		return nil, false, fmt.Errorf("leaving namespace %s: %w", ns, serr)
	}
	if err != nil {
		return nil, true, fmt.Errorf("listening in namespace %s: %w", ns, err)
	}
	return c, true, nil
}

// removeStale deletes the namespaces of networks whose test process died
// without closing them (SIGKILLed, or a timeout panic): their names
// carry the creator's PID, and only ones whose PID is gone are touched.
func removeStale() {
	ents, err := os.ReadDir("/var/run/netns")
	if err != nil {
		return
	}
	for _, e := range ents {
		rest, ok := strings.CutPrefix(e.Name(), "tern-chaos-")
		if !ok {
			continue
		}
		rest = strings.TrimPrefix(rest, "probe-")
		pidStr, _, _ := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidStr)
		if err != nil || pid == os.Getpid() {
			continue
		}
		if _, err := os.Stat("/proc/" + pidStr); err == nil {
			continue // its creator still runs
		}
		run("ip", "netns", "del", e.Name())
	}
}

// probe says why namespaces cannot be made here, or nil.
func probe() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("%w: not running as root (euid %d)", ErrNotSupported, os.Geteuid())
	}
	for _, tool := range []string{"ip", "tc"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%w: %s not found: %v", ErrNotSupported, tool, err)
		}
	}
	if _, err := os.Stat("/proc/self/ns/net"); err != nil {
		return fmt.Errorf("%w: kernel without network namespaces: %v", ErrNotSupported, err)
	}
	name := fmt.Sprintf("tern-chaos-probe-%d", os.Getpid())
	if err := run("ip", "netns", "add", name); err != nil {
		return fmt.Errorf("%w: %v", ErrNotSupported, err)
	}
	defer run("ip", "netns", "del", name)
	if err := run("ip", "netns", "exec", name, "tc", "qdisc", "add", "dev", "lo", "clsact"); err != nil {
		return fmt.Errorf("%w: no clsact qdisc for cuts: %v", ErrNotSupported, err)
	}
	if err := run("ip", "netns", "exec", name, "tc", "filter", "add", "dev", "lo", "egress",
		"bpf", "da", "bytecode", dropAll); err != nil {
		return fmt.Errorf("%w: no tc-bpf drop filter for cuts: %v", ErrNotSupported, err)
	}
	return nil
}

func run(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("running %s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}
