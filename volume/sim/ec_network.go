package sim

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"sync"
	"time"
)

// packetNet is the erasure-coded world's network: datagram sockets
// (net.PacketConn, what quic-go runs on) between simulated hosts. Every
// datagram is delayed, and by the seeded chances dropped, duplicated,
// held back past later ones (reordered) or delayed long; a partition
// drops everything between two hosts until it heals. It is a
// transport.Network, so the production dial and listen code, QUIC and
// TLS 1.3 with mutual authentication run over it unchanged. It runs in a
// synctest bubble: every delay is a timer in virtual time.
type packetNet struct {
	mu      sync.Mutex
	rng     *rand.Rand // guarded by mu
	chances Probabilities
	socks   map[string]*packetSock // by address
	ports   map[string]int         // next free port, by host
	cut     map[[2]string]time.Time
	// counts are the packet faults injected, by kind.
	counts FaultCounts
}

// datagram is one packet in flight.
type datagram struct {
	from net.Addr
	data []byte
}

// packetBase is the delay every datagram takes; packetJitter is added at
// random, reordering packets sent close together.
const (
	packetBase   = 50 * time.Microsecond
	packetJitter = 100 * time.Microsecond
	// packetLate is how late a reordered packet may come, packetSlow a
	// delayed one (long enough to trip QUIC's loss detection).
	packetLate = 2 * time.Millisecond
	packetSlow = 40 * time.Millisecond
	// inboxPackets is a socket's receive buffer; past it packets drop,
	// as a full kernel buffer drops them.
	inboxPackets = 4096
)

func newPacketNet(seed uint64, chances Probabilities) *packetNet {
	return &packetNet{
		rng: rand.New(rand.NewPCG(seed, 0x9e7)), chances: chances,
		socks: map[string]*packetSock{}, ports: map[string]int{}, cut: map[[2]string]time.Time{},
	}
}

// ResolveAddr implements transport.Network.
func (n *packetNet) ResolveAddr(addr string) (net.Addr, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	p, err := strconv.Atoi(port)
	ip := net.ParseIP(host)
	if err != nil || ip == nil {
		return nil, fmt.Errorf("simulated network: bad address %q", addr)
	}
	return &net.UDPAddr{IP: ip, Port: p}, nil
}

// ListenPacket implements transport.Network. "" binds a free port of the
// host that dials next (dialFrom); a dialer's host is set by the world
// before it dials, which is why it needs no address of its own.
func (n *packetNet) ListenPacket(addr string) (net.PacketConn, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if addr == "" {
		return nil, errors.New("simulated network: a socket needs its host (use hostNet)")
	}
	a, err := n.ResolveAddr(addr)
	if err != nil {
		return nil, err
	}
	ua := a.(*net.UDPAddr)
	if ua.Port == 0 {
		host := ua.IP.String()
		n.ports[host]++
		ua.Port = 40000 + n.ports[host]
	}
	if n.socks[ua.String()] != nil {
		return nil, fmt.Errorf("simulated network: %v: address in use", ua)
	}
	s := &packetSock{net: n, addr: ua, inbox: make(chan datagram, inboxPackets), closed: make(chan struct{}), deadlineSet: make(chan struct{})}
	n.socks[ua.String()] = s
	return s, nil
}

// hostNet is the network as one host sees it: ListenPacket("") binds a
// free port of host, so a dialer's packets are known to come from it.
type hostNet struct {
	*packetNet
	host string
}

func (h hostNet) ListenPacket(addr string) (net.PacketConn, error) {
	if addr == "" {
		addr = net.JoinHostPort(h.host, "0")
	}
	return h.packetNet.ListenPacket(addr)
}

// partition cuts the hosts a and b apart until until.
func (n *packetNet) partition(a, b string, until time.Time) {
	n.mu.Lock()
	n.cut[hostPair(a, b)] = until
	n.mu.Unlock()
}

// heal ends every partition.
func (n *packetNet) heal() {
	n.mu.Lock()
	clear(n.cut)
	n.mu.Unlock()
}

// faultCounts returns the packet faults injected so far.
func (n *packetNet) faultCounts() FaultCounts {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.counts
}

// quiet turns the packet faults off (the world's faulty phase ended).
func (n *packetNet) quiet() {
	n.mu.Lock()
	n.chances = Probabilities{}
	n.mu.Unlock()
}

func hostPair(a, b string) [2]string {
	if a > b {
		a, b = b, a
	}
	return [2]string{a, b}
}

// send carries p from s to the socket at to, by the seeded chances.
func (n *packetNet) send(s *packetSock, p []byte, to net.Addr) {
	n.mu.Lock()
	defer n.mu.Unlock()
	dst := n.socks[to.String()]
	if dst == nil {
		return // nobody listens: the datagram is lost
	}
	from, into := s.addr.IP.String(), dst.addr.IP.String()
	if until, ok := n.cut[hostPair(from, into)]; ok {
		if time.Now().Before(until) {
			return
		}
		delete(n.cut, hostPair(from, into))
	}
	if n.rng.Float64() < n.chances[faultDrop] {
		n.counts[faultDrop]++
		return
	}
	copies := 1
	if n.rng.Float64() < n.chances[faultDuplicate] {
		n.counts[faultDuplicate]++
		copies = 2
	}
	for range copies {
		delay := packetBase + time.Duration(n.rng.Int64N(int64(packetJitter)))
		switch {
		case n.rng.Float64() < n.chances[faultReorder]:
			n.counts[faultReorder]++
			delay += time.Duration(n.rng.Int64N(int64(packetLate)))
		case n.rng.Float64() < n.chances[faultDelay]:
			n.counts[faultDelay]++
			delay += packetSlow
		}
		d := datagram{from: s.addr, data: append([]byte(nil), p...)}
		time.AfterFunc(delay, func() { dst.deliver(d) })
	}
}

// packetSock is one socket of packetNet.
type packetSock struct {
	net   *packetNet
	addr  *net.UDPAddr
	inbox chan datagram

	closeOnce sync.Once
	closed    chan struct{}

	mu          sync.Mutex
	deadline    time.Time
	deadlineSet chan struct{} // closed and replaced when the deadline changes
}

// errTimeout is a read deadline passing: a net.Error whose Timeout is true.
type errTimeout struct{}

func (errTimeout) Error() string   { return "simulated network: i/o timeout" }
func (errTimeout) Timeout() bool   { return true }
func (errTimeout) Temporary() bool { return true }
func (errTimeout) Unwrap() error   { return os.ErrDeadlineExceeded }

func (s *packetSock) deliver(d datagram) {
	select {
	case <-s.closed:
	case s.inbox <- d:
	default: // the receive buffer is full
	}
}

// ReadFrom implements net.PacketConn.
func (s *packetSock) ReadFrom(p []byte) (int, net.Addr, error) {
	for {
		s.mu.Lock()
		deadline, changed := s.deadline, s.deadlineSet
		s.mu.Unlock()
		var timer *time.Timer
		var timeout <-chan time.Time
		if !deadline.IsZero() {
			wait := time.Until(deadline)
			if wait <= 0 {
				return 0, nil, errTimeout{}
			}
			timer = time.NewTimer(wait)
			timeout = timer.C
		}
		n, from, err, again := 0, net.Addr(nil), error(nil), false
		select {
		case d := <-s.inbox:
			n, from = copy(p, d.data), d.from
		case <-s.closed:
			err = net.ErrClosed
		case <-timeout:
			err = errTimeout{}
		case <-changed:
			again = true
		}
		if timer != nil {
			timer.Stop()
		}
		if !again {
			return n, from, err
		}
	}
}

// WriteTo implements net.PacketConn.
func (s *packetSock) WriteTo(p []byte, addr net.Addr) (int, error) {
	select {
	case <-s.closed:
		return 0, net.ErrClosed
	default:
	}
	s.net.send(s, p, addr)
	return len(p), nil
}

// Close implements net.PacketConn: the address is free again.
func (s *packetSock) Close() error {
	s.closeOnce.Do(func() {
		close(s.closed)
		s.net.mu.Lock()
		if s.net.socks[s.addr.String()] == s {
			delete(s.net.socks, s.addr.String())
		}
		s.net.mu.Unlock()
	})
	return nil
}

// LocalAddr implements net.PacketConn.
func (s *packetSock) LocalAddr() net.Addr { return s.addr }

// SetDeadline implements net.PacketConn (writes never block).
func (s *packetSock) SetDeadline(t time.Time) error { return s.SetReadDeadline(t) }

// SetReadDeadline implements net.PacketConn.
func (s *packetSock) SetReadDeadline(t time.Time) error {
	s.mu.Lock()
	s.deadline = t
	close(s.deadlineSet)
	s.deadlineSet = make(chan struct{})
	s.mu.Unlock()
	return nil
}

// SetWriteDeadline implements net.PacketConn (writes never block).
func (s *packetSock) SetWriteDeadline(time.Time) error { return nil }

// SetReadBuffer and SetWriteBuffer accept any size (quic-go asks for
// large kernel buffers; the inbox is the buffer here).
func (s *packetSock) SetReadBuffer(int) error  { return nil }
func (s *packetSock) SetWriteBuffer(int) error { return nil }
