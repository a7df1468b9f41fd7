package chaos

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// maxFlows bounds how many client addresses one proxy serves: a volume
// dials each replica once per session, so a handful are live at a time.
const maxFlows = 64

// Proxy forwards UDP datagrams between clients on its listening socket and
// one target, impairing both directions. Each client address gets its own
// socket towards the target, opened by the Proxy's dial function (in the
// netns tests, inside the upstairs host's namespace), so the target sees
// one peer per client, as it would without the proxy.
type Proxy struct {
	ln     *net.UDPConn
	target *net.UDPAddr
	dial   func() (*net.UDPConn, error)

	impair atomic.Pointer[Impairment]
	closed atomic.Bool
	wg     sync.WaitGroup

	mu    sync.Mutex
	rng   *rand.Rand            // guarded by mu
	flows map[string]*proxyFlow // guarded by mu; by client address
	stats ProxyStats            // guarded by mu
}

type proxyFlow struct {
	client *net.UDPAddr
	up     *net.UDPConn
}

// ProxyStats counts what a proxy did with the datagrams it received.
type ProxyStats struct {
	Received, Dropped, Duplicated, Forwarded int64
}

// NewProxy listens on listen (host:port) and forwards to target through
// sockets from dial; seed makes the impairment draws reproducible.
func NewProxy(listen string, target *net.UDPAddr, dial func() (*net.UDPConn, error), seed uint64) (*Proxy, error) {
	laddr, err := net.ResolveUDPAddr("udp", listen)
	if err != nil {
		return nil, fmt.Errorf("resolving proxy address: %w", err)
	}
	ln, err := net.ListenUDP("udp", laddr)
	if err != nil {
		return nil, fmt.Errorf("listening for proxy: %w", err)
	}
	p := &Proxy{ln: ln, target: target, dial: dial,
		rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), flows: map[string]*proxyFlow{}}
	p.impair.Store(&Impairment{})
	p.wg.Go(p.readClients)
	return p, nil
}

// Addr is where clients send.
func (p *Proxy) Addr() *net.UDPAddr { return p.ln.LocalAddr().(*net.UDPAddr) }

// SetImpairment changes what the link does from the next datagram on.
func (p *Proxy) SetImpairment(imp Impairment) error {
	if err := imp.Validate(); err != nil {
		return err
	}
	p.impair.Store(&imp)
	return nil
}

// Stats returns the counts so far.
func (p *Proxy) Stats() ProxyStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stats
}

// Close stops forwarding and closes every socket; datagrams still
// delayed are dropped.
func (p *Proxy) Close() error {
	if p.closed.Swap(true) {
		return nil
	}
	err := p.ln.Close()
	p.mu.Lock()
	for _, f := range p.flows {
		f.up.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	return err
}

func (p *Proxy) readClients() {
	buf := make([]byte, 64<<10)
	for {
		n, client, err := p.ln.ReadFromUDP(buf)
		if err != nil {
			if !p.closed.Load() && !errors.Is(err, net.ErrClosed) {
				continue // a transient error (ICMP feedback); keep serving
			}
			return
		}
		f, err := p.flow(client)
		if err != nil {
			continue // no socket for this client: the datagram is lost
		}
		p.forward(buf[:n], func(b []byte) { f.up.WriteToUDP(b, p.target) })
	}
}

// flow returns the client's flow, opening its socket towards the target
// and starting its reader the first time.
func (p *Proxy) flow(client *net.UDPAddr) (*proxyFlow, error) {
	key := client.String()
	p.mu.Lock()
	f, ok := p.flows[key]
	n := len(p.flows)
	p.mu.Unlock()
	if ok {
		return f, nil
	}
	if n >= maxFlows {
		return nil, fmt.Errorf("opening flow for %v: %d flows already", client, n)
	}
	up, err := p.dial()
	if err != nil {
		return nil, fmt.Errorf("opening flow for %v: %w", client, err)
	}
	f = &proxyFlow{client: client, up: up}
	p.mu.Lock()
	if p.closed.Load() {
		p.mu.Unlock()
		up.Close()
		return nil, net.ErrClosed
	}
	p.flows[key] = f
	p.mu.Unlock()
	p.wg.Go(func() { p.readTarget(f) })
	return f, nil
}

func (p *Proxy) readTarget(f *proxyFlow) {
	buf := make([]byte, 64<<10)
	for {
		n, _, err := f.up.ReadFromUDP(buf)
		if err != nil {
			if !p.closed.Load() && !errors.Is(err, net.ErrClosed) {
				continue
			}
			return
		}
		p.forward(buf[:n], func(b []byte) { p.ln.WriteToUDP(b, f.client) })
	}
}

// forward applies one verdict to b: send now, later, twice, or never.
// Delayed copies own a copy of b, and are dropped if the proxy closed.
func (p *Proxy) forward(b []byte, send func([]byte)) {
	imp := p.impair.Load()
	p.mu.Lock()
	v := imp.Decide(p.rng)
	p.stats.Received++
	switch v.Copies {
	case 0:
		p.stats.Dropped++
	case 2:
		p.stats.Duplicated++
	}
	p.stats.Forwarded += int64(v.Copies)
	p.mu.Unlock()
	for i := range v.Copies {
		if v.Delays[i] == 0 {
			send(b)
			continue
		}
		c := append([]byte(nil), b...)
		time.AfterFunc(v.Delays[i], func() {
			if !p.closed.Load() {
				send(c)
			}
		})
	}
}
