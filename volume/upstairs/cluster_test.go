package upstairs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"tern/internal/testwait"
	"tern/internal/tlsconf/tlstest"
	"tern/volume/downstairs"
	"tern/volume/extent"
	"tern/volume/ids"
	"tern/volume/transport"
	"tern/volume/upstairs/engine"
	"tern/volume/volumetest"
)

// Test geometry: 8 extents of 64 blocks of 4 KiB (2 MiB).
const (
	testBlockSize    = 4096
	testExtentBlocks = 64
	testExtentCount  = 8
	testTimeout      = 60 * time.Second // generous: only a failing test waits it out
)

// testDownstairs is one replica: a region directory served on 127.0.0.1
// over real QUIC with mutual TLS. It can be stopped and restarted on the
// same address.
type testDownstairs struct {
	t      testing.TB
	dir    string
	addr   string
	region *extent.Region
	ln     *transport.Listener
	cancel context.CancelFunc
	done   chan error
}

// cluster is three downstairs of one region.
type cluster struct {
	t    testing.TB
	ds   [engine.ReplicaCount]*testDownstairs
	spec extent.Spec
}

func newCluster(t testing.TB) *cluster {
	t.Helper()
	return newClusterSpec(t, extent.NewSpec(testBlockSize, testExtentBlocks, testExtentCount))
}

func newClusterSpec(t testing.TB, spec extent.Spec) *cluster {
	t.Helper()
	c := &cluster{t: t, spec: spec}
	for i := range c.ds {
		c.ds[i] = newDownstairs(t, spec)
	}
	return c
}

func newDownstairs(t testing.TB, spec extent.Spec) *testDownstairs {
	t.Helper()
	dir := t.TempDir()
	if err := downstairs.Create(dir, spec); err != nil {
		t.Fatal(err)
	}
	d := &testDownstairs{t: t, dir: dir, addr: "127.0.0.1:0"}
	d.start()
	t.Cleanup(d.stop)
	return d
}

func (d *testDownstairs) start() {
	d.t.Helper()
	region, err := extent.Open(d.dir)
	if err != nil {
		d.t.Fatal(err)
	}
	ln, err := transport.Listen(d.addr, tlstest.Shared(d.t).ServerConfig())
	if err != nil {
		region.Close()
		d.t.Fatal(err)
	}
	d.region, d.ln, d.addr = region, ln, ln.Addr().String()
	srv := downstairs.NewServer(region, downstairs.Config{Workers: 4})
	ctx, cancel := context.WithCancel(context.Background())
	d.cancel, d.done = cancel, make(chan error, 1)
	go func() { d.done <- srv.Serve(ctx, ln) }()
}

// stop shuts the server down (killing its sessions) and closes the region;
// idempotent.
func (d *testDownstairs) stop() {
	if d.cancel == nil {
		return
	}
	d.cancel()
	d.cancel = nil
	select {
	case err := <-d.done:
		if err != nil {
			d.t.Errorf("downstairs Serve: %v", err)
		}
	case <-time.After(testTimeout):
		d.t.Errorf("downstairs Serve did not return")
	}
	d.ln.Close()
	if err := d.region.Close(); err != nil {
		d.t.Errorf("close region: %v", err)
	}
}

func (c *cluster) targets() []string {
	return []string{c.ds[0].addr, c.ds[1].addr, c.ds[2].addr}
}

func (c *cluster) config() Config {
	return Config{
		Logger:       testLogger(c.t),
		Targets:      c.targets(),
		TLS:          tlstest.Shared(c.t).ClientConfig(""),
		ReconnectMin: 10 * time.Millisecond,
		ReconnectMax: 100 * time.Millisecond,
	}
}

// open activates a new upstairs at gen; it is closed at cleanup.
func (c *cluster) open(cfg Config, gen ids.Generation) *Upstairs {
	c.t.Helper()
	u, err := New(cfg)
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { u.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	if err := u.Activate(ctx, gen); err != nil {
		c.t.Fatalf("Activate: %v", err)
	}
	return u
}

// readRegions stops every downstairs and returns each replica's blocks,
// read from its extent files.
func (c *cluster) readRegions() [engine.ReplicaCount][]byte {
	c.t.Helper()
	var out [engine.ReplicaCount][]byte
	size := int(c.spec.ExtentBlocks) * int(c.spec.ExtentCount) * int(c.spec.BlockSize)
	for i, d := range c.ds {
		d.stop()
		r, err := extent.Open(d.dir)
		if err != nil {
			c.t.Fatal(err)
		}
		buf := make([]byte, size)
		hashes := make([]uint64, size/int(c.spec.BlockSize))
		if err := r.ReadBlocks(0, buf, hashes); err != nil {
			c.t.Fatalf("replica %d: %v", i, err)
		}
		r.Close()
		out[i] = buf
	}
	return out
}

// requireSameReplicas fails unless every replica holds the same blocks.
func (c *cluster) requireSameReplicas(want []byte) {
	c.t.Helper()
	regions := c.readRegions()
	bs := int(c.spec.BlockSize)
	for i, r := range regions {
		ref := want
		if ref == nil {
			ref = regions[0]
		}
		for b := 0; b < len(r); b += bs {
			if !bytes.Equal(r[b:b+bs], ref[b:b+bs]) {
				c.t.Fatalf("replica %d block %d differs", i, b/bs)
			}
		}
	}
}

// testLogger sends the upstairs' logs to the test log (shown on failure
// or with -v).
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Logf("%s", bytes.TrimRight(p, "\n"))
	return len(p), nil
}

// waitStatus waits until the upstairs' Status satisfies cond, reading it
// again at each of the upstairs' steps (Upstairs.StatusChanged: a reply,
// a job, a state change), and returns it; it fails after testTimeout.
func waitStatus(t testing.TB, u *Upstairs, what string, cond func(Status) bool) Status {
	t.Helper()
	var st Status
	if !testwait.On(testTimeout, u.StatusChanged, func() bool { st = u.Status(); return cond(st) }) {
		t.Fatalf("timed out waiting for %s: %+v", what, st)
	}
	return st
}

// waitState waits, on Upstairs.ReplicaStateChanged, until replica r is
// in state s.
func waitState(t testing.TB, u *Upstairs, r int, s engine.ReplicaState) {
	t.Helper()
	var st ReplicaStatus
	if !testwait.On(testTimeout, u.ReplicaStateChanged, func() bool { st = u.Status().Replicas[r]; return st.State == s }) {
		t.Fatalf("timed out waiting for replica %d to be %v: %+v", r, s, st)
	}
}

// stopAndWaitLeft stops downstairs r and waits until the upstairs has
// seen it leave Active. A test that restarts it next and then waits for
// Active must not find the old session still Active: that wait would
// return before the upstairs noticed the restart at all.
func stopAndWaitLeft(t testing.TB, cl *volumetest.Cluster, u *Upstairs, r int) {
	t.Helper()
	if err := cl.Stop(r); err != nil {
		t.Fatal(err)
	}
	var st ReplicaStatus
	if !testwait.On(testTimeout, u.ReplicaStateChanged, func() bool { st = u.Status().Replicas[r]; return st.State != engine.ReplicaActive }) {
		t.Fatalf("timed out waiting for replica %d to leave Active after its downstairs stopped: %+v", r, st)
	}
}

// ownGoroutines lists goroutines running upstairs or dial code.
func ownGoroutines() []string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var own []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "tern/volume/upstairs.(*Upstairs)") ||
			strings.Contains(g, "tern/volume/upstairs.(*replica)") ||
			strings.Contains(g, "tern/volume/transport.Dial") {
			own = append(own, g)
		}
	}
	return own
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// model is the expected content of the volume.
type model struct {
	mu   sync.Mutex
	data []byte
}

func (m *model) write(p []byte, off int64) {
	m.mu.Lock()
	copy(m.data[off:], p)
	m.mu.Unlock()
}

func (m *model) check(t testing.TB, p []byte, off int64) {
	t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	if !bytes.Equal(p, m.data[off:off+int64(len(p))]) {
		for b := 0; b < len(p); b += testBlockSize {
			if !bytes.Equal(p[b:b+testBlockSize], m.data[off+int64(b):off+int64(b)+testBlockSize]) {
				t.Fatalf("block %d differs from what was written", (off+int64(b))/testBlockSize)
			}
		}
	}
}

func volumeBytes() int64 { return testBlockSize * testExtentBlocks * testExtentCount }

var _ = errors.Is
var _ = fmt.Sprint
var _ = filepath.Join
var _ = uuid.Nil
