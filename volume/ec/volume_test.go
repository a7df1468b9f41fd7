package ec

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"tern/volume/downstairs"
)

// A 4+2 volume reads back what was written in full stripes, partial
// stripes and single blocks, and a scrub finds every stripe's parity
// consistent with its data.
func TestWriteReadScrub4Plus2(t *testing.T) {
	c := newTestCluster(t, DefaultLayout)
	v := c.open(1)
	size := int64(v.SizeBytes())
	if want := int64(4 * testBlockSize * (testExtentBlocks*testExtentCount - 1)); size != want {
		t.Fatalf("Size = %d, want %d (4 × a shard but its metadata block)", size, want)
	}
	want := pattern(1, 0, int(size))
	mustWrite(t, v, want, 0) // full stripes, in 1 MiB chunks
	// Partial stripes: one block, three blocks across a stripe boundary,
	// an unaligned run of many stripes.
	for _, w := range []struct{ off, n int64 }{{5, 1}, {7, 3}, {101, 57}, {1000, 1}} {
		p := pattern(2, w.off*testBlockSize, int(w.n*testBlockSize))
		copy(want[w.off*testBlockSize:], p)
		mustWrite(t, v, p, w.off*testBlockSize)
	}
	mustRead(t, v, want, 0)
	mustRead(t, v, want[9*testBlockSize:12*testBlockSize], 9*testBlockSize)
	rep, err := v.Scrub(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if rep.BlocksRewritten != 0 || rep.StripesChecked != uint64(size/testBlockSize/4) {
		t.Fatalf("Scrub = %+v, want every stripe checked and nothing rewritten", rep)
	}
}

// Two shards (m) lost: IO continues on the other four, the data reads
// back intact; when the two return they are rebuilt where they missed
// writes, with the repair's progress reported, and then the volume
// reads back intact with two other shards gone.
func TestTwoShardsLostIOContinuesThenRepaired(t *testing.T) {
	c := newTestCluster(t, DefaultLayout)
	v := c.open(1)
	size := int64(v.SizeBytes())
	want := pattern(1, 0, int(size))
	mustWrite(t, v, want, 0)
	// Closed cleanly (every shard flushed), so the shards stopped below
	// have lost nothing and are behind only on what is written after.
	if err := v.Close(); err != nil {
		t.Fatal(err)
	}
	v = c.open(2)
	for _, i := range []int{1, 4} { // a data shard and a parity shard
		if err := c.cl.Stop(i); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, v, "shards 1 and 4 offline", func(st Status) bool {
		return st.Shards[1].State == ShardOffline && st.Shards[4].State == ShardOffline
	})
	// Degraded: overwrite the first extent's worth of stripes, partly.
	degraded := pattern(3, 0, 4*testExtentBlocks*testBlockSize)
	mustWrite(t, v, degraded[:len(degraded)-5*testBlockSize], 0)
	copy(want, degraded[:len(degraded)-5*testBlockSize])
	mustRead(t, v, want, 0)
	if err := v.Flush(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{1, 4} {
		if err := c.cl.Start(i); err != nil {
			t.Fatal(err)
		}
	}
	st := waitFor(t, v, "every shard active again", allActive)
	for _, i := range []int{1, 4} {
		r := st.Shards[i].Repair
		if r == nil || r.Phase != "done" || r.BlocksCompared == 0 || r.BytesDone == 0 || r.ExtentsTotal != 1 {
			t.Fatalf("shard %d repair = %+v, want done, one extent, blocks compared and copied", i, r)
		}
		// Only the stripes written while it was away differ.
		if r.BytesDone > uint64(testExtentBlocks*testBlockSize) {
			t.Fatalf("shard %d repair copied %d bytes, more than the %d written while it was away", i, r.BytesDone, testExtentBlocks*testBlockSize)
		}
	}
	for _, i := range []int{0, 5} {
		if err := c.cl.Stop(i); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, v, "shards 0 and 5 offline", func(st Status) bool {
		return st.Shards[0].State == ShardOffline && st.Shards[5].State == ShardOffline
	})
	mustRead(t, v, want, 0)
}

// With three shards of a 4+2 volume lost, IO waits (an IO bounded by its
// context fails with ErrNotEnoughShards); an IO still waiting completes
// once a shard returns, and nothing acknowledged is lost.
func TestThreeShardsLostIOWaits(t *testing.T) {
	c := newTestCluster(t, DefaultLayout)
	v := c.open(1)
	want := pattern(1, 0, 64*testBlockSize)
	mustWrite(t, v, want, 0)
	// Closed cleanly (every shard flushed): a shard that restarts has
	// lost nothing, and counts towards the stripes' shards once back.
	if err := v.Close(); err != nil {
		t.Fatal(err)
	}
	v = c.open(2)
	for _, i := range []int{0, 2, 5} {
		if err := c.cl.Stop(i); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, v, "three shards offline", func(st Status) bool {
		n := 0
		for _, s := range st.Shards {
			if s.State == ShardOffline {
				n++
			}
		}
		return n == 3
	})
	short, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	_, err := v.WriteAt(short, make([]byte, testBlockSize), 0)
	cancel()
	if !errors.Is(err, ErrNotEnoughShards) {
		t.Fatalf("WriteAt with 3 of 6 shards = %v, want ErrNotEnoughShards", err)
	}
	later := pattern(9, 8*testBlockSize, 6*testBlockSize)
	done := make(chan error, 1)
	go func() {
		_, err := v.WriteAt(ctxT(t), later, 8*testBlockSize)
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("WriteAt returned %v with 3 of 6 shards", err)
	case <-time.After(200 * time.Millisecond):
	}
	if err := c.cl.Start(2); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("WriteAt after a shard returned: %v", err)
	}
	copy(want[8*testBlockSize:], later)
	mustRead(t, v, want, 0)
}

// A bit flipped at rest in a data shard's extent file is never served:
// the read reconstructs the block from the stripe, and the shard is
// repaired so that a scrub finds nothing left to fix.
func TestFlippedBitReconstructedAndRepaired(t *testing.T) {
	c := newTestCluster(t, DefaultLayout)
	v := c.open(1)
	want := pattern(1, 0, 64*testBlockSize)
	mustWrite(t, v, want, 0)
	if err := v.Close(); err != nil {
		t.Fatal(err)
	}
	// Client block 9 is on data shard 1 at stripe 2.
	if err := c.cl.Stop(1); err != nil {
		t.Fatal(err)
	}
	flipBit(t, c.cl.RegionDir(1), 2)
	if err := c.cl.Start(1); err != nil {
		t.Fatal(err)
	}
	v = c.open(2)
	mustRead(t, v, want, 0)
	st := waitFor(t, v, "shard 1 repaired", allActive)
	if r := st.Shards[1].Repair; r == nil || r.BytesDone != testBlockSize {
		t.Fatalf("shard 1 repair = %+v, want one block rewritten", r)
	}
	rep, err := v.Scrub(ctxT(t))
	if err != nil || rep.BlocksRewritten != 0 {
		t.Fatalf("Scrub after repair = %+v, %v; want nothing to rewrite", rep, err)
	}
}

// Concurrent overlapping writes, full and partial stripes, with reads
// among them, leave every stripe's parity consistent with its data (a
// scrub rewrites nothing) and the data equal to some order of the writes
// per block (each block holds one writer's whole block).
func TestConcurrentOverlappingWritesStayConsistent(t *testing.T) {
	c := newTestCluster(t, DefaultLayout)
	v := c.open(1)
	const span = 96 // blocks, 24 stripes
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 7))
			for range 40 {
				off := r.IntN(span - 9)
				n := 1 + r.IntN(9)
				p := make([]byte, n*testBlockSize)
				for b := range n {
					for i := b * testBlockSize; i < (b+1)*testBlockSize; i++ {
						p[i] = byte(w + 1)
					}
				}
				if r.IntN(3) == 0 {
					if _, err := v.ReadAt(ctxT(t), p, int64(off)*testBlockSize); err != nil {
						t.Error(err)
						return
					}
					continue
				}
				if _, err := v.WriteAt(ctxT(t), p, int64(off)*testBlockSize); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	got := make([]byte, span*testBlockSize)
	if _, err := v.ReadAt(ctxT(t), got, 0); err != nil {
		t.Fatal(err)
	}
	for b := range span {
		blk := got[b*testBlockSize : (b+1)*testBlockSize]
		for _, x := range blk {
			if x != blk[0] {
				t.Fatalf("block %d mixes two writers' data", b)
			}
		}
	}
	rep, err := v.Scrub(ctxT(t))
	if err != nil || rep.BlocksRewritten != 0 {
		t.Fatalf("Scrub = %+v, %v; want parity consistent everywhere", rep, err)
	}
}

// Activating the shards with a higher generation fences the volume that
// had them: its IO fails with ErrFenced.
func TestHigherGenerationFences(t *testing.T) {
	c := newTestCluster(t, DefaultLayout)
	old := c.open(1)
	mustWrite(t, old, pattern(1, 0, testBlockSize), 0)
	c.open(2)
	waitFor(t, old, "the old volume fenced", func(st Status) bool { return errors.Is(st.Err, ErrFenced) })
	if _, err := old.WriteAt(ctxT(t), make([]byte, testBlockSize), 0); !errors.Is(err, ErrFenced) {
		t.Fatalf("WriteAt on the fenced volume = %v, want ErrFenced", err)
	}
}

// Activation goes ahead with k+1 shards after the quorum wait, the
// missing one named in Status, and the missing shard joins later and is
// rebuilt where it is behind.
func TestActivationWithoutAShardThenJoin(t *testing.T) {
	c := newTestCluster(t, DefaultLayout)
	if err := c.cl.Stop(3); err != nil {
		t.Fatal(err)
	}
	v := c.open(1)
	if st := v.Status(); st.Shards[3].State == ShardActive {
		t.Fatalf("shard 3 is %s while stopped", st.Shards[3].State)
	}
	want := pattern(4, 0, 16*testBlockSize)
	mustWrite(t, v, want, 0)
	if err := c.cl.Start(3); err != nil {
		t.Fatal(err)
	}
	waitFor(t, v, "shard 3 joined and repaired", allActive)
	for _, i := range []int{0, 1} {
		if err := c.cl.Stop(i); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, v, "shards 0 and 1 offline", func(st Status) bool {
		return st.Shards[0].State == ShardOffline && st.Shards[1].State == ShardOffline
	})
	mustRead(t, v, want, 0)
}

// Three shards of a 4+2 volume stop with unflushed writes (they may have
// lost them, so their dirty extents are not trusted when they return): a
// write waits; with one back it still waits (four shards, one of them
// unverified, cannot vouch for a stripe); with two back the stripes
// check out against each other, the write completes and everything
// acknowledged reads back.
func TestThreeShardsLostUnflushedResumeOnceTheyCheckOut(t *testing.T) {
	c := newTestCluster(t, DefaultLayout)
	v := c.open(1)
	want := pattern(1, 0, 64*testBlockSize)
	mustWrite(t, v, want, 0) // acknowledged, not flushed
	// Every shard applied it (acknowledged at five, the sixth follows).
	waitFor(t, v, "every shard current", allActive)
	for _, i := range []int{0, 2, 5} {
		if err := c.cl.Stop(i); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, v, "three shards offline", func(st Status) bool {
		return st.Shards[0].State == ShardOffline && st.Shards[2].State == ShardOffline && st.Shards[5].State == ShardOffline
	})
	later := pattern(9, 8*testBlockSize, 6*testBlockSize)
	done := make(chan error, 1)
	go func() {
		_, err := v.WriteAt(ctxT(t), later, 8*testBlockSize)
		done <- err
	}()
	if err := c.cl.Start(2); err != nil {
		t.Fatal(err)
	}
	waitFor(t, v, "shard 2 back", func(st Status) bool { return st.Shards[2].State != ShardOffline })
	select {
	case err := <-done:
		t.Fatalf("WriteAt returned %v with one unverified shard back", err)
	case <-time.After(300 * time.Millisecond):
	}
	if err := c.cl.Start(5); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("WriteAt after two shards returned: %v", err)
	}
	copy(want[8*testBlockSize:], later)
	mustRead(t, v, want, 0)
}

// goroutinesRunning lists the goroutines whose stack mentions code.
func goroutinesRunning(code string) []string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var own []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, code) && !strings.Contains(g, "goroutinesRunning") {
			own = append(own, g)
		}
	}
	return own
}

// Close leaves no goroutine of the volume behind: shard owners, session
// readers, repair loops and writes still waiting for a slow shard's
// answer all end with it, including after IO with shards lost.
func TestCloseLeavesNoGoroutine(t *testing.T) {
	c := newTestCluster(t, DefaultLayout)
	v := c.open(1)
	mustWrite(t, v, pattern(1, 0, 32*testBlockSize), 0)
	if err := c.cl.Stop(2); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, v, pattern(2, 0, 32*testBlockSize), 0)
	if err := v.Close(); err != nil {
		t.Fatal(err)
	}
	// Close waited for every goroutine of its own.
	if left := goroutinesRunning("tern/volume/ec.(*"); len(left) > 0 {
		t.Fatalf("%d goroutines left after Close:\n%s", len(left), strings.Join(left, "\n\n"))
	}
	// What a dial started (quic-go's, the transport's socket reaper)
	// ends with its connection, which Close closed.
	deadline := time.Now().Add(10 * time.Second)
	for g := goroutinesRunning("tern/volume/transport.Dial"); len(g) > 0; g = goroutinesRunning("tern/volume/transport.Dial") {
		if time.Now().After(deadline) {
			t.Fatalf("%d dial goroutines survived Close:\n%s", len(g), strings.Join(g, "\n\n"))
		}
		runtime.Gosched()
	}
}

// A bit flipped at rest in a parity shard is never read by a healthy
// read (reads go to data shards); a scrub finds it (the block fails its
// hash), rewrites it from the stripe, and a second scrub finds nothing.
func TestScrubRewritesAFlippedParityBlock(t *testing.T) {
	c := newTestCluster(t, DefaultLayout)
	v := c.open(1)
	want := pattern(1, 0, 64*testBlockSize)
	mustWrite(t, v, want, 0)
	if err := v.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.cl.Stop(4); err != nil {
		t.Fatal(err)
	}
	flipBit(t, c.cl.RegionDir(4), 3)
	if err := c.cl.Start(4); err != nil {
		t.Fatal(err)
	}
	v = c.open(2)
	mustRead(t, v, want, 0)
	rep, err := v.Scrub(ctxT(t))
	if err != nil || rep.BlocksRewritten != 1 {
		t.Fatalf("Scrub = %+v, %v; want the parity block rewritten", rep, err)
	}
	if rep, err := v.Scrub(ctxT(t)); err != nil || rep.BlocksRewritten != 0 {
		t.Fatalf("second Scrub = %+v, %v; want nothing left", rep, err)
	}
}

// A shard replaced by an empty region while the volume runs is rebuilt
// when it joins again: its blocks read as zeros without failing a hash,
// so the volume must know the extents it held data on (found by the
// seeded campaign, which read zeros back). With m other shards then
// stopped, everything still reads back, from the rebuilt shard too.
func TestShardReplacedWhileRunningIsRebuilt(t *testing.T) {
	for _, flushed := range []bool{true, false} {
		name := "unflushed"
		if flushed {
			name = "flushed"
		}
		t.Run(name, func(t *testing.T) {
			c := newTestCluster(t, DefaultLayout)
			v := c.open(1)
			want := pattern(5, 0, 2*testExtentBlocks*4*testBlockSize)
			mustWrite(t, v, want, 0)
			if flushed {
				if err := v.Flush(ctxT(t)); err != nil {
					t.Fatal(err)
				}
			}
			if err := c.cl.Stop(1); err != nil {
				t.Fatal(err)
			}
			waitFor(t, v, "shard 1 offline", func(st Status) bool { return st.Shards[1].State == ShardOffline })
			if err := os.RemoveAll(c.cl.RegionDir(1)); err != nil {
				t.Fatal(err)
			}
			if err := downstairs.Create(c.cl.RegionDir(1), c.cl.Spec); err != nil {
				t.Fatal(err)
			}
			if err := c.cl.Start(1); err != nil {
				t.Fatal(err)
			}
			st := waitFor(t, v, "every shard active", allActive)
			if r := st.Shards[1].Repair; r == nil || r.BytesDone == 0 {
				t.Fatalf("shard 1 repair = %+v, want its blocks rebuilt", r)
			}
			for _, i := range []int{0, 2} {
				if err := c.cl.Stop(i); err != nil {
					t.Fatal(err)
				}
			}
			waitFor(t, v, "shards 0 and 2 offline", func(st Status) bool {
				return st.Shards[0].State == ShardOffline && st.Shards[2].State == ShardOffline
			})
			mustRead(t, v, want, 0)
		})
	}
}
