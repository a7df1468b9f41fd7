package transport

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"tern/internal/testwait"
	"tern/internal/tlsconf/tlstest"
)

func TestMutualTLSSessionStreamCarriesBytesBothWays(t *testing.T) {
	b := tlstest.Loopback(t)
	ln, err := Listen("127.0.0.1:0", b.ServerConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	served := make(chan error, 1)
	go func() {
		c, err := ln.Accept(ctx)
		if err != nil {
			served <- err
			return
		}
		// The client closes the connection once it has read the reply;
		// closing it here could discard the reply before it is sent.
		defer func() { <-c.Context().Done() }()
		if got := c.ConnectionState().TLS.NegotiatedProtocol; got != NextProto {
			served <- errors.New("negotiated " + got)
			return
		}
		if len(c.ConnectionState().TLS.PeerCertificates) == 0 {
			served <- errors.New("no client certificate")
			return
		}
		s, err := c.AcceptStream(ctx)
		if err != nil {
			served <- err
			return
		}
		buf := make([]byte, 5)
		if _, err := io.ReadFull(s, buf); err != nil {
			served <- err
			return
		}
		_, err = s.Write([]byte(strings.ToUpper(string(buf))))
		s.Close()
		served <- err
	}()

	conn, err := Dial(ctx, ln.Addr().String(), b.ClientConfig("127.0.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	s, err := conn.OpenStreamSync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	reply, err := io.ReadAll(s)
	if err != nil || string(reply) != "HELLO" {
		t.Fatalf("reply %q, %v", reply, err)
	}
	conn.CloseWithError(0, "")
	if err := <-served; err != nil {
		t.Fatal(err)
	}
}

func TestUntrustedClientCertificateIsRefused(t *testing.T) {
	server, stranger := tlstest.Loopback(t), tlstest.Loopback(t)
	ln, err := Listen("127.0.0.1:0", server.ServerConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The stranger trusts the server's CA but presents its own certificate.
	conf := stranger.ClientConfig("127.0.0.1")
	conf.RootCAs = server.ServerConfig().ClientCAs
	conn, err := Dial(ctx, ln.Addr().String(), conf)
	if err == nil {
		// TLS 1.3 clients learn of the rejection after the handshake.
		_, err = conn.AcceptStream(ctx)
	}
	if err == nil {
		t.Fatal("connection with an untrusted client certificate was accepted")
	}
}

func TestClientWithoutCertificateIsRefused(t *testing.T) {
	b := tlstest.Loopback(t)
	ln, err := Listen("127.0.0.1:0", b.ServerConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conf := &tls.Config{RootCAs: b.ServerConfig().ClientCAs, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS13}
	conn, err := Dial(ctx, ln.Addr().String(), conf)
	if err == nil {
		_, err = conn.AcceptStream(ctx)
	}
	if err == nil {
		t.Fatal("connection without a client certificate was accepted")
	}
}

func TestDialedSocketClosesWithConnection(t *testing.T) {
	b := tlstest.Loopback(t)
	ln, err := Listen("127.0.0.1:0", b.ServerConfig())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	before := testwait.Running()
	accepted := make(chan error, 1)
	go func() {
		// The server closes: the dialer's socket must go with its
		// connection whichever side ends it.
		c, err := ln.Accept(ctx)
		if err == nil {
			c.CloseWithError(0, "bye")
		}
		accepted <- err
	}()
	conn, err := Dial(ctx, ln.Addr().String(), b.ClientConfig("127.0.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	local := conn.LocalAddr().(*net.UDPAddr)
	if err := <-accepted; err != nil {
		t.Fatal(err)
	}
	select {
	case <-conn.Context().Done():
	case <-ctx.Done():
		t.Fatal("connection not closed by the server")
	}
	ln.Close()
	// The dial's socket is released: its port can be bound again.
	for {
		c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: local.Port})
		if err == nil {
			c.Close()
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("dialed socket still bound: %v", err)
		}
		runtime.Gosched()
	}
	before.Returned(t, 30*time.Second)
}
