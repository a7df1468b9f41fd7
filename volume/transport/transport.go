package transport

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"slices"
	"time"

	"github.com/quic-go/quic-go"
)

// NextProto is the ALPN protocol identifier of the volume protocol.
const NextProto = "tern-volume/1"

// Flow-control windows and timers of Config.
const (
	// MaxStreamWindow bounds the receive window of the session stream:
	// room for 32 queued 1 MiB writes plus their frame headers, so queue
	// depth 32 is never throttled by flow control on a fast path.
	MaxStreamWindow = 48 << 20
	// MaxConnectionWindow bounds the receive window of a connection.
	MaxConnectionWindow = 64 << 20
	// KeepAlivePeriod is how often a quiet connection is pinged, by
	// default: it keeps NAT bindings fresh and, as every ping must be
	// acknowledged, keeps the idle timer of a live peer from expiring.
	KeepAlivePeriod = time.Second
	// IdleTimeout is how long a dialed connection waits, by default, for
	// any packet from its peer before it is closed: how soon a downstairs
	// that was killed, hung or cut off is noticed: within 5 s, with room
	// for timers that fire late on a busy machine. Four keepalives fit in
	// it, so a live peer is not dropped for a late acknowledgement or two.
	IdleTimeout = 4 * time.Second
	// ListenIdleTimeout is the idle timeout a listener offers. QUIC uses
	// the smaller of the two ends' values, so the dialer decides, up to
	// this bound (DialOptions lengthens it for slow hosts).
	ListenIdleTimeout = 60 * time.Second
	// HandshakeTimeout bounds the QUIC and TLS handshake.
	HandshakeTimeout = 10 * time.Second
)

// DialOptions tune how soon a dialed connection gives up on a silent
// peer; zero fields take KeepAlivePeriod and IdleTimeout.
type DialOptions struct {
	// KeepAlivePeriod is how often a quiet connection is pinged. quic-go
	// pings at least twice per IdleTimeout whatever it is set to.
	KeepAlivePeriod time.Duration
	// IdleTimeout closes the connection after this long without a packet
	// from the peer (at most ListenIdleTimeout takes effect against a
	// Listener of this package).
	IdleTimeout time.Duration
	// Network opens the dialer's socket and resolves addresses; nil is
	// the host's UDP.
	Network Network
}

// Network is where the transport's datagram sockets come from. nil, the
// default everywhere, is the host's UDP. volume/sim's erasure-coded world
// passes a simulated network, so the production dial, listen, QUIC and
// TLS code runs unchanged over seeded packet faults in virtual time.
type Network interface {
	// ListenPacket opens a socket on addr (host:port; "" picks a free
	// address).
	ListenPacket(addr string) (net.PacketConn, error)
	// ResolveAddr turns host:port into the address a socket sends to.
	ResolveAddr(addr string) (net.Addr, error)
}

func (o DialOptions) withDefaults() DialOptions {
	if o.KeepAlivePeriod <= 0 {
		o.KeepAlivePeriod = KeepAlivePeriod
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = IdleTimeout
	}
	return o
}

// Config returns the QUIC configuration of a dialer with default
// options: windows that start at 8 MiB per stream (16 MiB per
// connection) so the first burst of writes is not throttled while
// quic-go's auto-tuning grows them, keepalive, and few peer-initiated
// streams (a session needs one).
func Config() *quic.Config { return dialConfig(DialOptions{}) }

// listenConfig is Config with the listener's idle timeout.
func listenConfig() *quic.Config {
	c := Config()
	c.MaxIdleTimeout = ListenIdleTimeout
	return c
}

func dialConfig(o DialOptions) *quic.Config {
	o = o.withDefaults()
	return &quic.Config{
		HandshakeIdleTimeout:           HandshakeTimeout,
		MaxIdleTimeout:                 o.IdleTimeout,
		KeepAlivePeriod:                o.KeepAlivePeriod,
		InitialStreamReceiveWindow:     8 << 20,
		MaxStreamReceiveWindow:         MaxStreamWindow,
		InitialConnectionReceiveWindow: 16 << 20,
		MaxConnectionReceiveWindow:     MaxConnectionWindow,
		MaxIncomingStreams:             16,
		MaxIncomingUniStreams:          -1,
	}
}

// withALPN returns a copy of conf that offers NextProto.
func withALPN(conf *tls.Config) (*tls.Config, error) {
	if conf == nil {
		return nil, errors.New("no TLS configuration")
	}
	c := conf.Clone()
	if !slices.Contains(c.NextProtos, NextProto) {
		c.NextProtos = append(c.NextProtos, NextProto)
	}
	return c, nil
}

// Listener accepts QUIC connections of the volume protocol. It owns its
// UDP socket.
type Listener struct {
	udp net.PacketConn
	ln  *quic.Listener
}

// Listen listens for QUIC connections on the UDP address addr (host:port;
// port 0 picks a free one). tlsConf should require and verify client
// certificates (tlsconf's ServerConfig does); NextProto is added to it.
func Listen(addr string, tlsConf *tls.Config) (*Listener, error) {
	return ListenOn(nil, addr, tlsConf)
}

// ListenOn is Listen on nw's sockets (nil: the host's UDP).
func ListenOn(nw Network, addr string, tlsConf *tls.Config) (*Listener, error) {
	conf, err := withALPN(tlsConf)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", addr, err)
	}
	var udp net.PacketConn
	if nw != nil {
		udp, err = nw.ListenPacket(addr)
	} else {
		udp, err = listenUDP(addr)
	}
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", addr, err)
	}
	ln, err := quic.Listen(udp, conf, listenConfig())
	if err != nil {
		udp.Close()
		return nil, fmt.Errorf("listen %s: %w", addr, err)
	}
	return &Listener{udp: udp, ln: ln}, nil
}

// Accept waits for the next connection whose handshake completed.
func (l *Listener) Accept(ctx context.Context) (*quic.Conn, error) {
	c, err := l.ln.Accept(ctx)
	if err != nil {
		return nil, fmt.Errorf("accept connection: %w", err)
	}
	return c, nil
}

// Addr returns the local UDP address.
func (l *Listener) Addr() net.Addr { return l.udp.LocalAddr() }

// Close stops accepting, closes every connection accepted from this
// listener, and closes the UDP socket.
func (l *Listener) Close() error {
	err := l.ln.Close()
	if cerr := l.udp.Close(); err == nil && !errors.Is(cerr, net.ErrClosed) {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("close listener: %w", err)
	}
	return nil
}

// Dial connects to a downstairs at addr (host:port) over a UDP socket of
// its own, with default DialOptions. tlsConf should present a client
// certificate and verify the server (tlsconf's ClientConfig does);
// NextProto is added to it. The socket is closed when the returned
// connection closes, whichever side closes it.
func Dial(ctx context.Context, addr string, tlsConf *tls.Config) (*quic.Conn, error) {
	return DialWith(ctx, addr, tlsConf, DialOptions{})
}

// DialWith is Dial with opts deciding how soon a silent peer is given up.
func DialWith(ctx context.Context, addr string, tlsConf *tls.Config, opts DialOptions) (*quic.Conn, error) {
	conf, err := withALPN(tlsConf)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	raddr, udp, err := dialSocket(addr, opts.Network)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	tr := &quic.Transport{Conn: udp}
	conn, err := tr.Dial(ctx, raddr, conf, dialConfig(opts))
	if err != nil {
		tr.Close()
		udp.Close()
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	// The connection owns this goroutine: it ends when the connection
	// closes, and releases the transport and socket the dial created.
	go func() {
		<-conn.Context().Done()
		tr.Close()
		udp.Close()
	}()
	return conn, nil
}

// dialSocket resolves addr and opens a socket to send to it from, on nw
// (nil: the host's UDP).
func dialSocket(addr string, nw Network) (net.Addr, net.PacketConn, error) {
	if nw != nil {
		raddr, err := nw.ResolveAddr(addr)
		if err != nil {
			return nil, nil, err
		}
		udp, err := nw.ListenPacket("")
		return raddr, udp, err
	}
	raddr, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return nil, nil, err
	}
	local := ":0"
	if raddr.IP.To4() != nil {
		local = "0.0.0.0:0"
	}
	udp, err := listenUDP(local)
	return raddr, udp, err
}

// listenUDP opens a UDP socket on addr with enlarged kernel buffers.
func listenUDP(addr string) (*net.UDPConn, error) {
	laddr, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return nil, err
	}
	udp, err := net.ListenUDP("udp", laddr)
	if err != nil {
		return nil, err
	}
	raiseSocketBuffers(udp)
	return udp, nil
}
