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
	// KeepAlivePeriod keeps NAT bindings and the idle timer fresh on a
	// session that is waiting for IO.
	KeepAlivePeriod = 5 * time.Second
	// IdleTimeout closes a connection whose peer has vanished; the
	// keepalive makes a live but quiet peer immune to it.
	IdleTimeout = 30 * time.Second
	// HandshakeTimeout bounds the QUIC and TLS handshake.
	HandshakeTimeout = 10 * time.Second
)

// Config returns the QUIC configuration shared by both ends: windows
// that start at 8 MiB per stream (16 MiB per connection) so the first
// burst of writes is not throttled while quic-go's auto-tuning grows
// them, keepalive, and few peer-initiated streams (a session needs one).
func Config() *quic.Config {
	return &quic.Config{
		HandshakeIdleTimeout:           HandshakeTimeout,
		MaxIdleTimeout:                 IdleTimeout,
		KeepAlivePeriod:                KeepAlivePeriod,
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
	udp *net.UDPConn
	ln  *quic.Listener
}

// Listen listens for QUIC connections on the UDP address addr (host:port;
// port 0 picks a free one). tlsConf should require and verify client
// certificates (tlsconf's ServerConfig does); NextProto is added to it.
func Listen(addr string, tlsConf *tls.Config) (*Listener, error) {
	conf, err := withALPN(tlsConf)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", addr, err)
	}
	udp, err := listenUDP(addr)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", addr, err)
	}
	ln, err := quic.Listen(udp, conf, Config())
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
// its own. tlsConf should present a client certificate and verify the
// server (tlsconf's ClientConfig does); NextProto is added to it. The
// socket is closed when the returned connection closes, whichever side
// closes it.
func Dial(ctx context.Context, addr string, tlsConf *tls.Config) (*quic.Conn, error) {
	conf, err := withALPN(tlsConf)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	raddr, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	local := ":0"
	if raddr.IP.To4() != nil {
		local = "0.0.0.0:0"
	}
	udp, err := listenUDP(local)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	tr := &quic.Transport{Conn: udp}
	conn, err := tr.Dial(ctx, raddr, conf, Config())
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
