package nbd

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"
)

// conn is one client connection. Its reader (run) owns the request
// stream: it parses each request, reads its payload and starts a
// goroutine per request; the writer goroutine owns the reply stream and
// sends each reply as its request completes. Requests of one connection
// are independent (the protocol orders nothing between them), so a
// reply may overtake one sent before it.
type conn struct {
	// Immutable after newConn.
	s   *Server
	nc  net.Conn // as accepted; deadlines and Close go here
	log *slog.Logger

	// replies carries finished requests to the writer; closed by run
	// once the reader and every request goroutine are done.
	replies chan *reply
	// inflight counts request goroutines.
	inflight sync.WaitGroup
	budget   budget

	mu sync.Mutex
	// stopping is set by stopReading; the reader ends at the next
	// request boundary (a read deadline in the past wakes it).
	stopping bool
}

func newConn(s *Server, nc net.Conn, id uint64) *conn {
	return &conn{
		s:       s,
		nc:      nc,
		log:     s.log.With("conn", id, "client", nc.RemoteAddr().String()),
		replies: make(chan *reply, s.cfg.MaxInFlight),
		budget:  budget{maxCount: s.cfg.MaxInFlight, maxBytes: s.cfg.MaxInFlightBytes},
	}
}

// stopReading makes the reader stop at the next request boundary (or in
// the handshake, at once); requests already read still complete.
func (c *conn) stopReading() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stopping = true
	_ = c.nc.SetReadDeadline(time.Now())
}

func (c *conn) isStopping() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stopping
}

// run serves the connection from handshake to close.
func (c *conn) run() {
	defer c.s.untrack(c)
	defer c.nc.Close()
	_ = c.nc.SetDeadline(time.Now().Add(c.s.cfg.HandshakeTimeout))
	n, err := c.s.negotiate(c.nc)
	if err != nil {
		switch {
		case errors.Is(err, errAborted):
			c.log.Debug("client aborted the handshake")
		case c.isStopping():
			c.log.Info("closed during the handshake: shutting down")
		case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
			c.log.Info("client left during the handshake", "err", err)
		default:
			c.s.stats.handshakeFailed.Add(1)
			c.log.Warn("handshake failed, disconnecting client", "reason", err.Error())
		}
		return
	}
	c.mu.Lock()
	_ = c.nc.SetDeadline(time.Time{})
	if c.stopping {
		_ = c.nc.SetReadDeadline(time.Now())
	}
	c.mu.Unlock()
	c.log.Debug("transmission started", "structured_replies", n.structured)
	wdone := make(chan struct{})
	go func() {
		defer close(wdone)
		c.write(n)
	}()
	reason := c.read(n)
	c.inflight.Wait()
	close(c.replies)
	<-wdone
	if reason != "" {
		c.s.stats.disconnected.Add(1)
		c.log.Warn("disconnecting client", "reason", reason)
	}
}

// read reads and dispatches requests until the client disconnects, sends
// NBD_CMD_DISC, breaks the protocol or the server stops. It returns why
// the connection must be dropped for a protocol violation, or "".
func (c *conn) read(n negotiated) string {
	br := bufio.NewReaderSize(n.conn, 64<<10)
	var hdr [requestHeaderBytes]byte
	for {
		if got, err := io.ReadFull(br, hdr[:]); err != nil {
			switch {
			case c.isStopping():
				c.log.Debug("stopped reading: shutting down")
			case got == 0 && errors.Is(err, io.EOF):
				c.log.Debug("client closed the connection")
			case errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF):
				c.log.Info("client closed the connection mid-request", "header_bytes", got)
			default:
				c.log.Info("reading request", "err", err)
			}
			return ""
		}
		r, err := parseRequest(&hdr)
		if err != nil {
			return err.Error()
		}
		if r.cmd == cmdDisc {
			c.log.Debug("client disconnected (NBD_CMD_DISC)")
			return ""
		}
		v := checkRequest(r, c.s.geo)
		if v.disconnect != "" {
			return v.disconnect
		}
		held := int64(v.payload) + int64(readBytes(r, v))
		c.budget.acquire(held)
		var buf *buffer
		if v.payload > 0 {
			buf = getBuffer(int(v.payload))
			if _, err := io.ReadFull(br, buf.b); err != nil {
				putBuffer(buf)
				if c.isStopping() {
					// Its reply says why the write was not done.
					c.replies <- &reply{cookie: r.cookie, cmd: r.cmd, errno: ESHUTDOWN, message: "server shutting down", release: held}
					return ""
				}
				c.budget.release(held)
				c.log.Info("client closed the connection mid-request", "cmd", cmdName(r.cmd), "err", err)
				return ""
			}
		}
		c.inflight.Add(1)
		go c.serve(r, v, buf, held)
	}
}

// readBytes is what a request will hold in memory while it runs.
func readBytes(r request, v verdict) uint32 {
	if r.cmd == cmdRead && v.errno == 0 {
		return r.length
	}
	return 0
}

// serve runs one request and hands its reply, which releases the
// request's share of the budget once sent, to the writer.
func (c *conn) serve(r request, v verdict, buf *buffer, held int64) {
	defer c.inflight.Done()
	rep := &reply{cookie: r.cookie, cmd: r.cmd, offset: r.offset, errno: v.errno, release: held}
	defer func() { c.replies <- rep }()
	defer putBuffer(buf)
	if v.errno != 0 {
		rep.message = fmt.Sprintf("%s of %d bytes at %d refused", cmdName(r.cmd), r.length, r.offset)
		c.s.stats.errors.Add(1)
		return
	}
	ctx, cancel := c.requestContext()
	defer cancel()
	if err := c.do(ctx, r, buf, rep); err != nil {
		rep.errno, rep.message = EIO, err.Error()
		c.s.stats.errors.Add(1)
		c.log.Warn("request failed", "cmd", cmdName(r.cmd), "offset", r.offset, "length", r.length, "err", err)
	}
}

func (c *conn) requestContext() (context.Context, context.CancelFunc) {
	if t := c.s.cfg.RequestTimeout; t > 0 {
		return context.WithTimeout(c.s.base, t)
	}
	return context.WithCancel(c.s.base)
}

// do performs r on the device; a READ's data goes into rep.
func (c *conn) do(ctx context.Context, r request, buf *buffer, rep *reply) error {
	dev := c.s.cfg.Export.Device
	st := &c.s.stats
	off := int64(r.offset)
	fua := r.flags&cmdFlagFUA != 0
	switch r.cmd {
	case cmdRead:
		rb := getBuffer(int(r.length))
		if _, err := dev.ReadAt(ctx, rb.b, off); err != nil {
			putBuffer(rb)
			return err
		}
		rep.buf, rep.data = rb, rb.b
		st.reads.Add(1)
		st.bytesRead.Add(int64(r.length))
		return nil
	case cmdWrite:
		var p []byte // nil for a write of no bytes
		if buf != nil {
			p = buf.b
		}
		if _, err := dev.WriteAt(ctx, p, off); err != nil {
			return err
		}
	case cmdWriteZeroes:
		if err := writeZeroes(ctx, dev, off, int64(r.length)); err != nil {
			return err
		}
	case cmdTrim:
		// Advisory (the protocol promises nothing about trimmed
		// data), and the volume has no discard: nothing to do.
		st.trims.Add(1)
	case cmdFlush:
		if err := dev.Flush(ctx); err != nil {
			return err
		}
		st.flushes.Add(1)
		return nil
	}
	if fua {
		if err := dev.Flush(ctx); err != nil {
			return err
		}
	}
	if r.cmd != cmdTrim {
		st.writes.Add(1)
		st.bytesWritten.Add(int64(r.length))
	}
	return nil
}

// zeroes is the source of WRITE_ZEROES; the device only reads it. It is
// made at the first WRITE_ZEROES, not when a process that links the
// package starts.
var zeroes = sync.OnceValue(func() []byte { return make([]byte, 8<<20) })

// writeZeroes writes length zero bytes at off, zeroChunk at a time (each
// WriteAt already fans out into many volume jobs).
func writeZeroes(ctx context.Context, dev Device, off, length int64) error {
	for length > 0 {
		n := min(length, int64(len(zeroes())))
		if _, err := dev.WriteAt(ctx, zeroes()[:n], off); err != nil {
			return err
		}
		off += n
		length -= n
	}
	return nil
}

// write sends replies as they arrive, batching those that are ready
// into one flush of the buffered writer. After a write error it keeps
// draining (so request goroutines never block) and closes the
// connection, which ends the reader.
func (c *conn) write(n negotiated) {
	bw := bufio.NewWriterSize(n.conn, 256<<10)
	var hdr []byte
	broken := false
	for rep := range c.replies {
		if !broken {
			hdr = hdr[:0]
			if n.structured {
				hdr = appendStructuredReply(hdr, rep)
			} else {
				hdr = appendSimpleReply(hdr, rep.cookie, rep.errno)
			}
			_, err := bw.Write(hdr)
			if err == nil && rep.errno == 0 && rep.cmd == cmdRead {
				_, err = bw.Write(rep.data)
			}
			if err == nil && len(c.replies) == 0 {
				err = bw.Flush()
			}
			if err != nil {
				broken = true
				if !errors.Is(err, net.ErrClosed) && !errors.Is(err, os.ErrDeadlineExceeded) {
					c.log.Info("sending replies", "err", err)
				}
				c.nc.Close()
			}
		}
		putBuffer(rep.buf)
		c.budget.release(rep.release)
	}
	if !broken {
		_ = bw.Flush()
	}
}

// budget bounds the requests a connection runs at once and the bytes
// they hold. Only the reader acquires; a single request larger than the
// byte bound is let through alone.
type budget struct {
	maxCount int
	maxBytes int64

	mu    sync.Mutex
	cond  *sync.Cond
	count int
	bytes int64
}

func (b *budget) acquire(n int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cond == nil {
		b.cond = sync.NewCond(&b.mu)
	}
	for b.count >= b.maxCount || b.count > 0 && b.bytes+n > b.maxBytes {
		b.cond.Wait()
	}
	b.count++
	b.bytes += n
}

func (b *budget) release(n int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.count--
	b.bytes -= n
	if b.cond != nil {
		b.cond.Broadcast()
	}
}
