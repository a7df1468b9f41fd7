package downstairs

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/cespare/xxhash/v2"
	"github.com/google/uuid"
	"github.com/quic-go/quic-go"

	"tern/internal/tlsconf/tlstest"
	"tern/volume/extent"
	"tern/volume/ids"
	"tern/volume/transport"
	"tern/volume/wire"
)

const (
	testBlockSize    = 4096
	testExtentBlocks = 64
	testExtentCount  = 4
	testTimeout      = 60 * time.Second // generous: only a failing test waits it out
)

// testServer is a downstairs on 127.0.0.1 over a real region directory.
type testServer struct {
	t      testing.TB
	dir    string
	region *extent.Region
	ln     *transport.Listener
	srv    *Server
	set    *metrics.Set
	logs   *syncBuffer
	cancel context.CancelFunc
	done   chan error
}

func newRegionDir(t testing.TB) (string, extent.Spec) {
	t.Helper()
	dir := t.TempDir()
	spec := extent.NewSpec(testBlockSize, testExtentBlocks, testExtentCount)
	if err := Create(dir, spec); err != nil {
		t.Fatal(err)
	}
	return dir, spec
}

func startServer(t testing.TB, dir string) *testServer {
	t.Helper()
	region, err := extent.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := transport.Listen("127.0.0.1:0", tlstest.Shared(t).ServerConfig())
	if err != nil {
		t.Fatal(err)
	}
	ts := &testServer{t: t, dir: dir, region: region, ln: ln, set: metrics.NewSet(), logs: &syncBuffer{}, done: make(chan error, 1)}
	logger := slog.New(slog.NewJSONHandler(ts.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ts.srv = NewServer(region, Config{Logger: logger, Metrics: ts.set, Workers: 8})
	ctx, cancel := context.WithCancel(context.Background())
	ts.cancel = cancel
	go func() { ts.done <- ts.srv.Serve(ctx, ln) }()
	t.Cleanup(ts.stop)
	return ts
}

// stop shuts the server down and closes its region; idempotent.
func (ts *testServer) stop() {
	if ts.cancel == nil {
		return
	}
	ts.cancel()
	ts.cancel = nil
	select {
	case err := <-ts.done:
		if err != nil {
			ts.t.Errorf("Serve: %v", err)
		}
	case <-time.After(testTimeout):
		ts.t.Errorf("Serve did not return after cancel")
	}
	ts.ln.Close()
	if err := ts.region.Close(); err != nil {
		ts.t.Errorf("close region: %v", err)
	}
}

func (ts *testServer) addr() string { return ts.ln.Addr().String() }

// client is a raw protocol client: one connection, one session stream, a
// reader goroutine delivering every frame to a channel.
type client struct {
	t        testing.TB
	conn     *quic.Conn
	stream   *quic.Stream
	enc      *wire.Encoder
	msgs     chan wire.Message
	readDone chan struct{}
	up, sess uuid.UUID
	next     wire.JobID
}

func dialRaw(t testing.TB, addr string, conf *tls.Config) (*client, error) {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	conn, err := transport.Dial(ctx, addr, conf)
	if err != nil {
		return nil, err
	}
	stream, err := conn.OpenStreamSync(ctx)
	if err != nil {
		conn.CloseWithError(0, "")
		return nil, err
	}
	c := &client{t: t, conn: conn, stream: stream, enc: wire.NewEncoder(stream),
		msgs: make(chan wire.Message, 1024), readDone: make(chan struct{}),
		up: uuid.New(), sess: uuid.New(), next: 1000}
	go c.readLoop()
	t.Cleanup(c.close)
	return c, nil
}

// readLoop copies every decoded frame (out of the decoder's storage) to
// msgs until the stream ends.
func (c *client) readLoop() {
	defer close(c.readDone)
	defer close(c.msgs)
	dec := wire.NewDecoder(c.stream)
	for {
		m, err := dec.Next()
		if err != nil {
			return
		}
		c.msgs <- wire.Clone(m)
	}
}

func (c *client) close() {
	c.conn.CloseWithError(0, "")
	<-c.readDone
}

// dial connects and completes Hello.
func dial(t testing.TB, addr string, readOnly bool) *client {
	t.Helper()
	c, err := dialRaw(t, addr, tlstest.Shared(t).ClientConfig("127.0.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	c.send(&wire.Hello{Versions: wire.SupportedVersions, ReadOnly: readOnly, UpstairsID: c.up, SessionID: c.sess})
	if _, ok := c.recv().(*wire.HelloReply); !ok {
		t.Fatal("no HelloReply")
	}
	return c
}

func (c *client) send(m wire.Message) {
	c.t.Helper()
	if err := c.enc.Encode(m); err != nil {
		c.t.Fatalf("send %v: %v", m.Type(), err)
	}
}

func (c *client) recv() wire.Message {
	c.t.Helper()
	select {
	case m, ok := <-c.msgs:
		if !ok {
			c.t.Fatal("session stream ended")
		}
		return m
	case <-time.After(testTimeout):
		c.t.Fatal("timed out waiting for a message")
	}
	return nil
}

func (c *client) jobID() wire.JobID {
	c.next++
	return c.next
}

// call sends a request and waits for its reply (there must be no other
// request in flight).
func (c *client) call(m wire.Message) wire.Message {
	c.t.Helper()
	c.send(m)
	want, _ := wire.JobOf(m)
	for {
		r := c.recv()
		if id, _ := wire.JobOf(r); id == want {
			return r
		}
	}
}

func (c *client) activate(gen ids.Generation) wire.Message {
	c.t.Helper()
	return c.call(&wire.Activate{JobID: c.jobID(), UpstairsID: c.up, SessionID: c.sess, Gen: gen})
}

func (c *client) mustActivate(gen ids.Generation) {
	c.t.Helper()
	if r, ok := c.activate(gen).(*wire.ActivateAck); !ok || r.Gen != gen {
		c.t.Fatalf("activate gen %d: %+v", gen, r)
	}
}

func blocks(n int, seed byte) ([]byte, []uint64) {
	p := make([]byte, n*testBlockSize)
	for i := range p {
		p[i] = seed ^ byte(i*13+i/testBlockSize)
	}
	return p, hashesOf(p)
}

func hashesOf(p []byte) []uint64 {
	h := make([]uint64, len(p)/testBlockSize)
	for i := range h {
		h[i] = xxhash.Sum64(p[i*testBlockSize : (i+1)*testBlockSize])
	}
	return h
}

func (c *client) write(off ids.BlockIndex, data []byte, deps ...wire.JobID) wire.Message {
	c.t.Helper()
	return c.call(&wire.Write{JobID: c.jobID(), Deps: deps, Offset: off, Hashes: hashesOf(data), Data: data})
}

func (c *client) mustWrite(off ids.BlockIndex, data []byte) {
	c.t.Helper()
	if r, ok := c.write(off, data).(*wire.Ack); !ok {
		c.t.Fatalf("write at %d: %s", off, describe(r))
	}
}

func (c *client) read(off ids.BlockIndex, n uint32) wire.Message {
	c.t.Helper()
	return c.call(&wire.Read{JobID: c.jobID(), Offset: off, Count: n})
}

func (c *client) mustRead(off ids.BlockIndex, n uint32) *wire.ReadResponse {
	c.t.Helper()
	r, ok := c.read(off, n).(*wire.ReadResponse)
	if !ok {
		c.t.Fatalf("read at %d: %s", off, describe(r))
	}
	return r
}

func describe(m wire.Message) string {
	if e, ok := m.(*wire.Error); ok {
		return e.Err().Error()
	}
	return fmt.Sprintf("%v %+v", m.Type(), m)
}

func wantError(t testing.TB, m wire.Message, code wire.ErrorCode) {
	t.Helper()
	e, ok := m.(*wire.Error)
	if !ok || e.Code != code {
		t.Fatalf("got %s, want Error %v", describe(m), code)
	}
}

func wantFenced(t testing.TB, m wire.Message, gen ids.Generation) {
	t.Helper()
	f, ok := m.(*wire.Fenced)
	if !ok || f.ByGen != gen {
		t.Fatalf("got %s, want Fenced by gen %d", describe(m), gen)
	}
}

// cloneMsg copies a decoded message out of the decoder's storage.

// syncBuffer is a goroutine-safe log sink.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// logRecords parses JSON log lines.
func logRecords(s string) []map[string]any {
	var out []map[string]any
	for line := range strings.SplitSeq(strings.TrimSpace(s), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil {
			out = append(out, m)
		}
	}
	return out
}
