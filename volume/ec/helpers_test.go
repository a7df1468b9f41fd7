package ec

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"tern/volume/extent"
	"tern/volume/ids"
	"tern/volume/volumetest"
)

// Test geometry: 4 KiB blocks, 64-block extents, 8 extents per shard
// (2 MiB a shard, 8 MiB a 4+2 volume).
const (
	testBlockSize    = 4096
	testExtentBlocks = 64
	testExtentCount  = 8
)

// testCluster is k+m in-process downstairs over real QUIC with mutual TLS.
type testCluster struct {
	t       *testing.T
	cl      *volumetest.Cluster
	layout  Layout
	targets []string // kept while shards stop and start
}

func newTestCluster(t *testing.T, l Layout) *testCluster {
	t.Helper()
	spec := extent.NewSpec(testBlockSize, testExtentBlocks, testExtentCount)
	cl, err := volumetest.NewClusterN(t.TempDir(), spec, l.Shards())
	if err != nil {
		t.Fatal(err)
	}
	if err := cl.StartAll(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return &testCluster{t: t, cl: cl, layout: l, targets: cl.Targets()}
}

func (c *testCluster) config() Config {
	return Config{
		Layout: c.layout, Targets: c.targets, TLS: c.cl.ClientTLS,
		ActivationQuorumWait: 300 * time.Millisecond,
		ReconnectMin:         20 * time.Millisecond, ReconnectMax: 200 * time.Millisecond,
		IdleTimeout: 2 * time.Second, KeepAlivePeriod: 500 * time.Millisecond,
	}
}

// open activates a volume at gen; it is closed at the end of the test.
func (c *testCluster) open(gen ids.Generation) *Volume {
	c.t.Helper()
	v, err := New(c.config())
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { v.Close() })
	if err := v.Activate(ctxT(c.t), gen); err != nil {
		c.t.Fatalf("Activate: %v", err)
	}
	return v
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// pattern is deterministic data for [off, off+n) under seed.
func pattern(seed uint64, off int64, n int) []byte {
	p := make([]byte, n)
	for b := 0; b < n; b += testBlockSize {
		r := rand.New(rand.NewPCG(seed, uint64(off)/testBlockSize+uint64(b/testBlockSize)))
		for i := b; i < b+testBlockSize; i += 8 {
			x := r.Uint64()
			for j := range 8 {
				p[i+j] = byte(x >> (8 * j))
			}
		}
	}
	return p
}

func mustWrite(t *testing.T, v *Volume, p []byte, off int64) {
	t.Helper()
	if _, err := v.WriteAt(ctxT(t), p, off); err != nil {
		t.Fatalf("WriteAt(%d, %d bytes): %v", off, len(p), err)
	}
}

func mustRead(t *testing.T, v *Volume, want []byte, off int64) {
	t.Helper()
	got := make([]byte, len(want))
	if _, err := v.ReadAt(ctxT(t), got, off); err != nil {
		t.Fatalf("ReadAt(%d, %d bytes): %v", off, len(want), err)
	}
	if !bytes.Equal(got, want) {
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("ReadAt(%d): first difference at byte %d (block %d)", off, i, (off+int64(i))/testBlockSize)
			}
		}
	}
}

// waitFor waits (on state changes, 60 s at most) until cond holds.
func waitFor(t *testing.T, v *Volume, what string, cond func(Status) bool) Status {
	t.Helper()
	deadline := time.After(60 * time.Second)
	for {
		ch := v.StateChanged()
		st := v.Status()
		if cond(st) {
			return st
		}
		select {
		case <-ch:
		case <-time.After(100 * time.Millisecond):
			// Bits cleared by writes do not announce themselves.
		case <-deadline:
			t.Fatalf("timed out waiting for %s: %+v", what, st.Shards)
		}
	}
}

func allActive(st Status) bool {
	for _, s := range st.Shards {
		if s.State != ShardActive {
			return false
		}
	}
	return true
}

// flipBit flips one bit of a block's data in a stopped shard's extent file.
func flipBit(t *testing.T, dir string, block int64) {
	t.Helper()
	name := filepath.Join(dir, fmt.Sprintf("%06d.ext", block/testExtentBlocks))
	f, err := os.OpenFile(name, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	off := block%testExtentBlocks*testBlockSize + 77
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x10
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}
