// Package transporttest gives tests a loopback QUIC connection with
// mutual TLS, as tern's processes make them (volume/transport and
// internal/tlsconf), for protocols that run over one: the migration's,
// for instance.
package transporttest

import (
	"context"
	"crypto/tls"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"tern/internal/tlsconf/tlstest"
	"tern/volume/transport"
)

// Pair returns the accepted and the dialed ends of a loopback QUIC
// connection with mutual TLS that negotiated proto (ALPN), within a
// minute; the cleanup closes both.
func Pair(t testing.TB, proto string) (accepted, dialed *quic.Conn) {
	t.Helper()
	b := tlstest.Loopback(t)
	withProto := func(c *tls.Config) *tls.Config {
		c.NextProtos = []string{proto}
		return c
	}
	ln, err := transport.Listen("127.0.0.1:0", withProto(b.ServerConfig()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	type result struct {
		c   *quic.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		c, err := transport.Dial(ctx, ln.Addr().String(), withProto(b.ClientConfig("127.0.0.1")))
		ch <- result{c, err}
	}()
	accepted, err = ln.Accept(ctx)
	if err != nil {
		t.Fatalf("accepting the loopback QUIC connection: %v", err)
	}
	d := <-ch
	if d.err != nil {
		accepted.CloseWithError(0, "")
		t.Fatalf("dialing the loopback QUIC connection: %v", d.err)
	}
	if p := accepted.ConnectionState().TLS.NegotiatedProtocol; p != proto {
		t.Fatalf("negotiated protocol %q, want %q", p, proto)
	}
	t.Cleanup(func() {
		accepted.CloseWithError(0, "")
		d.c.CloseWithError(0, "")
	})
	return accepted, d.c
}
