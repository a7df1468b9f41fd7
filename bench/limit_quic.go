package bench

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/quic-go/quic-go"

	"tern/volume/transport"
)

// The bare-QUIC limit: one connection, one bidirectional stream, the same
// transport configuration as the volume, and a peer that does nothing but
// answer. A request is a 12-byte header {id, request bytes, response
// bytes} plus the request payload; the answer is {id, bytes} plus that many
// bytes. A write-shaped load sends the block and gets a small ack; a
// read-shaped one sends a small request and gets the block: exactly the
// bytes a volume IO moves to one replica, with no storage behind them.
const (
	echoReqHeader  = 12
	echoRespHeader = 8
	echoSmall      = 32 // bytes of a small request or ack, about a wire header
)

// quicEcho is a running echo server.
type quicEcho struct {
	ln     *transport.Listener
	cancel context.CancelFunc
	done   chan struct{}
}

func startQUICEcho(serverTLS *tls.Config) (*quicEcho, error) {
	ln, err := transport.Listen("127.0.0.1:0", serverTLS)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	e := &quicEcho{ln: ln, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(e.done)
		var conns sync.WaitGroup
		defer conns.Wait()
		for {
			conn, err := ln.Accept(ctx)
			if err != nil {
				return
			}
			conns.Go(func() { serveEcho(ctx, conn) })
		}
	}()
	return e, nil
}

func (e *quicEcho) Addr() string { return e.ln.Addr().String() }

func (e *quicEcho) Close() {
	e.cancel()
	e.ln.Close()
	<-e.done
}

func serveEcho(ctx context.Context, conn *quic.Conn) {
	defer conn.CloseWithError(0, "")
	str, err := conn.AcceptStream(ctx)
	if err != nil {
		return
	}
	var hdr [echoReqHeader]byte
	var out [echoRespHeader]byte
	buf := make([]byte, 1<<21)
	for {
		if _, err := io.ReadFull(str, hdr[:]); err != nil {
			return
		}
		reqLen := binary.LittleEndian.Uint32(hdr[4:])
		respLen := binary.LittleEndian.Uint32(hdr[8:])
		if reqLen > uint32(len(buf)) || respLen > uint32(len(buf)) {
			return
		}
		if _, err := io.ReadFull(str, buf[:reqLen]); err != nil {
			return
		}
		copy(out[:4], hdr[:4])
		binary.LittleEndian.PutUint32(out[4:], respLen)
		if _, err := str.Write(out[:]); err != nil {
			return
		}
		if _, err := str.Write(buf[:respLen]); err != nil {
			return
		}
	}
}

// echoClient multiplexes queue-depth callers over one stream.
type echoClient struct {
	conn    *quic.Conn
	str     *quic.Stream
	writeMu sync.Mutex
	waiters []chan error
	bufs    [][]byte
	done    chan struct{}
}

func dialEcho(ctx context.Context, addr string, clientTLS *tls.Config, qd int) (*echoClient, error) {
	conn, err := transport.Dial(ctx, addr, clientTLS)
	if err != nil {
		return nil, err
	}
	str, err := conn.OpenStreamSync(ctx)
	if err != nil {
		conn.CloseWithError(0, "")
		return nil, fmt.Errorf("opening echo stream: %w", err)
	}
	c := &echoClient{conn: conn, str: str, waiters: make([]chan error, qd), bufs: make([][]byte, qd), done: make(chan struct{})}
	for i := range c.waiters {
		c.waiters[i] = make(chan error, 1)
	}
	go c.readLoop()
	return c, nil
}

func (c *echoClient) readLoop() {
	defer close(c.done)
	var hdr [echoRespHeader]byte
	fail := func(err error) {
		for _, w := range c.waiters {
			select {
			case w <- err:
			default:
			}
		}
	}
	for {
		if _, err := io.ReadFull(c.str, hdr[:]); err != nil {
			fail(err)
			return
		}
		id := binary.LittleEndian.Uint32(hdr[:4])
		n := binary.LittleEndian.Uint32(hdr[4:])
		if int(id) >= len(c.waiters) || int(n) > len(c.bufs[id]) {
			fail(errors.New("echo: bad response header"))
			return
		}
		if _, err := io.ReadFull(c.str, c.bufs[id][:n]); err != nil {
			fail(err)
			return
		}
		c.waiters[id] <- nil
	}
}

// do sends req and waits for respLen bytes into resp.
func (c *echoClient) do(ctx context.Context, worker int, req []byte, resp []byte) error {
	var hdr [echoReqHeader]byte
	binary.LittleEndian.PutUint32(hdr[:], uint32(worker))
	binary.LittleEndian.PutUint32(hdr[4:], uint32(len(req)))
	binary.LittleEndian.PutUint32(hdr[8:], uint32(len(resp)))
	c.bufs[worker] = resp
	c.writeMu.Lock()
	_, err := c.str.Write(hdr[:])
	if err == nil {
		_, err = c.str.Write(req)
	}
	c.writeMu.Unlock()
	if err != nil {
		return err
	}
	select {
	case err := <-c.waiters[worker]:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *echoClient) Close() {
	c.conn.CloseWithError(0, "")
	<-c.done
}

// quicLimit runs shape over one bare QUIC stream to a fresh echo server.
func quicLimit(ctx context.Context, serverTLS, clientTLS *tls.Config, shape IOShape, d time.Duration) (Result, error) {
	srv, err := startQUICEcho(serverTLS)
	if err != nil {
		return Result{}, err
	}
	defer srv.Close()
	c, err := dialEcho(ctx, srv.Addr(), clientTLS, shape.QueueDepth)
	if err != nil {
		return Result{}, err
	}
	defer c.Close()
	small := make([][]byte, shape.QueueDepth)
	for i := range small {
		small[i] = make([]byte, echoSmall)
	}
	// The load's offsets are irrelevant here; the space only bounds them.
	return runLoad(ctx, shape, int64(shape.BlockBytes)*1024, d, func(ctx context.Context, w int, buf []byte, _ int64) error {
		if shape.Write {
			return c.do(ctx, w, buf, small[w])
		}
		return c.do(ctx, w, small[w], buf)
	})
}
