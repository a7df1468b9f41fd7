package extent

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"tern/volume/ids"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// The tests in this file simulate power cuts. A faultHook stops a write,
// flush or repair at a chosen step and the region is then closed without
// flushing, so the files hold exactly what had been written when the power
// went: the worst case for everything not yet written. States that need
// reordering (metadata reaching disk before data, a torn block, a torn
// trailer) are built by writing the extent files directly while the region
// is closed. After reopening, every block must read back as data consistent
// with its recorded hash (old or new) or fail with ErrCorruptBlock.

// outcome is what a block may read back as after a power cut.
type outcome int

const (
	readsOld outcome = iota
	readsNew
	readsCorrupt
)

func (o outcome) String() string { return [...]string{"old data", "new data", "ErrCorruptBlock"}[o] }

// cutAt returns a fault hook that cuts the power the first time step is
// reached; once cut, every later step fails too (nothing runs after a
// power cut). It is safe for the concurrent calls of a parallel Flush.
func cutAt(step crashStep) func(crashStep) error {
	var cut atomic.Bool
	return func(s crashStep) error {
		if s == step {
			cut.Store(true)
		}
		if cut.Load() {
			return errPowerCut
		}
		return nil
	}
}

// cutAfter returns a fault hook that cuts the power at the n-th step
// reached, whatever it is, and at every step after.
func cutAfter(n int64) func(crashStep) error {
	var steps atomic.Int64
	return func(crashStep) error {
		if steps.Add(1) >= n {
			return errPowerCut
		}
		return nil
	}
}

// checkBlock reads block b and checks it against want.
func checkBlock(t *testing.T, r *Region, b ids.BlockIndex, oldData, newData []byte, want outcome) {
	t.Helper()
	got, err := readChecked(r, b, 1)
	switch {
	case want == readsCorrupt:
		var be *BlockError
		if !errors.Is(err, ErrCorruptBlock) || !errors.As(err, &be) || be.Block != b {
			t.Errorf("block %d: read = %v, want ErrCorruptBlock naming it", b, err)
		}
	case err != nil:
		t.Errorf("block %d: read = %v, want %v", b, err, want)
	case want == readsOld && !bytes.Equal(got, oldData):
		t.Errorf("block %d: did not read back the old data", b)
	case want == readsNew && !bytes.Equal(got, newData):
		t.Errorf("block %d: did not read back the new data", b)
	}
}

func TestPowerCutAtEachStepNeverServesWrongData(t *testing.T) {
	const bs = 4096
	for _, tc := range []struct {
		name      string
		step      crashStep // 0: no cut
		flush     bool      // the write is followed by a flush
		want      outcome
		wantDirty bool
	}{
		{"before the dirty trailer", stepBeforeDirtyTrailer, false, readsOld, false},
		{"after the dirty trailer before data", stepBeforeData, false, readsOld, true},
		{"after data before metadata", stepAfterData, false, readsCorrupt, true},
		{"after data and metadata", stepAfterMeta, false, readsNew, true},
		{"in a flush after the sync before the clean trailer", stepFlushSynced, true, readsNew, true},
		{"after a completed flush", 0, true, readsNew, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := createRegion(t, testSpec(bs, 8, 2))
			oldData := pattern(20, 4, bs)
			mustWrite(t, r, 2, oldData) // blocks 2..5
			if err := r.Flush(1, 1); err != nil {
				t.Fatal(err)
			}
			newData := pattern(21, 2, bs)
			r.faultHook = cutAt(tc.step)
			err := r.WriteBlocks(3, newData, hashesOf(newData, bs)) // blocks 3, 4
			if err == nil && tc.flush {
				err = r.Flush(2, 1)
			}
			if (tc.step != 0) != errors.Is(err, errPowerCut) {
				t.Fatalf("write/flush = %v", err)
			}

			r = reopen(t, r)
			checkBlock(t, r, 2, oldData[:bs], nil, readsOld)
			checkBlock(t, r, 3, oldData[bs:2*bs], newData[:bs], tc.want)
			checkBlock(t, r, 4, oldData[2*bs:3*bs], newData[bs:], tc.want)
			checkBlock(t, r, 5, oldData[3*bs:], nil, readsOld)
			wantCorrupt := []ids.BlockIndex(nil)
			if tc.want == readsCorrupt {
				wantCorrupt = []ids.BlockIndex{3, 4}
			}
			if got := r.CorruptBlocks(); !slices.Equal(got, wantCorrupt) {
				t.Errorf("CorruptBlocks = %v, want %v", got, wantCorrupt)
			}
			v, _ := r.ExtentVersion(0)
			if v.Dirty != tc.wantDirty || v.Gen != 1 {
				t.Errorf("extent 0 version %+v, want dirty=%v gen 1", v, tc.wantDirty)
			}

			// The replica recovers: rewriting the blocks and flushing
			// leaves a clean, consistent extent.
			mustWrite(t, r, 3, newData)
			if err := r.Flush(3, 1); err != nil {
				t.Fatal(err)
			}
			r = reopen(t, r)
			checkBlock(t, r, 3, nil, newData[:bs], readsNew)
			checkBlock(t, r, 4, nil, newData[bs:], readsNew)
			if v, _ := r.ExtentVersion(0); v != (Version{Gen: 1, Flush: 3}) {
				t.Errorf("after recovery extent 0 version %+v", v)
			}
			if got := r.CorruptBlocks(); len(got) != 0 {
				t.Errorf("after recovery CorruptBlocks = %v", got)
			}
		})
	}
}

func TestFirstWriteWithDataButNoMetadataIsCorruptAfterPowerCut(t *testing.T) {
	r := createRegion(t, testSpec(512, 4, 1))
	r.faultHook = cutAt(stepAfterData)
	p := pattern(22, 1, 512)
	if err := r.WriteBlocks(1, p, hashesOf(p, 512)); !errors.Is(err, errPowerCut) {
		t.Fatal(err)
	}
	r = reopen(t, r)
	checkBlock(t, r, 1, nil, nil, readsCorrupt)
	checkBlock(t, r, 0, make([]byte, 512), nil, readsOld)
}

// TestReorderedOrTornWritesAfterPowerCutNeverServeWrongData builds the
// states a power cut can leave when the page cache wrote back only part of
// a write, in any order.
func TestReorderedOrTornWritesAfterPowerCutNeverServeWrongData(t *testing.T) {
	const bs = 4096
	for _, tc := range []struct {
		name       string
		dataBytes  int  // bytes of the new block that reached disk
		metaLanded bool // the new metadata entry reached disk
		want       outcome
	}{
		{"nothing landed", 0, false, readsOld},
		{"torn data without metadata", 1000, false, readsCorrupt},
		{"all data without metadata", bs, false, readsCorrupt},
		{"metadata without data", 0, true, readsCorrupt},
		{"torn data with metadata", 2048, true, readsCorrupt},
		{"data and metadata", bs, true, readsNew},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := createRegion(t, testSpec(bs, 4, 2))
			oldData := pattern(23, 1, bs)
			mustWrite(t, r, 6, oldData) // extent 1, block 2
			if err := r.Flush(1, 1); err != nil {
				t.Fatal(err)
			}
			// The write got as far as making the trailer dirty.
			r.faultHook = cutAt(stepBeforeData)
			newData := pattern(24, 1, bs)
			if err := r.WriteBlocks(6, newData, hashesOf(newData, bs)); !errors.Is(err, errPowerCut) {
				t.Fatal(err)
			}
			r.Close()
			lay := newLayout(r.Spec())
			rawWriteAt(t, r.Dir(), 1, newData[:tc.dataBytes], lay.dataOff(2))
			if tc.metaLanded {
				var entry [metaEntrySize]byte
				putMeta(entry[:], xxhash.Sum64(newData), 99)
				rawWriteAt(t, r.Dir(), 1, entry[:], lay.metaEntryOff(2))
			}
			r = reopen(t, r)
			checkBlock(t, r, 6, oldData, newData, tc.want)
		})
	}
}

func TestGarbledTrailerIsTreatedAsDirty(t *testing.T) {
	const bs = 512
	for _, tc := range []struct {
		name   string
		garble func(t *testing.T, dir string, lay layout)
	}{
		{"random bytes", func(t *testing.T, dir string, lay layout) {
			rawWriteAt(t, dir, 0, pattern(25, 1, bs)[:trailerSize], lay.trailerOff)
		}},
		{"zeros", func(t *testing.T, dir string, lay layout) {
			rawWriteAt(t, dir, 0, make([]byte, trailerSize), lay.trailerOff)
		}},
		{"torn: first half of a newer trailer", func(t *testing.T, dir string, lay layout) {
			var buf [trailerSize]byte
			trailer{id: 0, ver: Version{Gen: 9, Flush: 9}}.encode(&buf)
			rawWriteAt(t, dir, 0, buf[:24], lay.trailerOff)
		}},
		{"one flipped bit", func(t *testing.T, dir string, lay layout) {
			b := rawReadAt(t, dir, 0, 1, lay.trailerOff+17)
			rawWriteAt(t, dir, 0, []byte{b[0] ^ 4}, lay.trailerOff+17)
		}},
		{"another extent's trailer", func(t *testing.T, dir string, lay layout) {
			rawWriteAt(t, dir, 0, rawReadAt(t, dir, 1, trailerSize, lay.trailerOff), lay.trailerOff)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := createRegion(t, testSpec(bs, 4, 2))
			good := pattern(26, 2, bs)
			mustWrite(t, r, 0, good)
			if err := r.Flush(5, 2); err != nil {
				t.Fatal(err)
			}
			r.Close()
			lay := newLayout(r.Spec())
			tc.garble(t, r.Dir(), lay)
			// And block 1's data is damaged: only a dirty-extent check finds it.
			rawWriteAt(t, r.Dir(), 0, []byte("damage"), lay.dataOff(1))

			r = reopen(t, r)
			if v, _ := r.ExtentVersion(0); v != (Version{Dirty: true}) {
				t.Errorf("extent 0 version %+v, want {Dirty: true}", v)
			}
			checkBlock(t, r, 0, good[:bs], nil, readsOld)
			checkBlock(t, r, 1, nil, nil, readsCorrupt)

			// The next write rewrites a proper dirty trailer before data.
			mustWrite(t, r, 2, pattern(27, 1, bs))
			if tr, ok := rawTrailer(t, r.Dir(), r.Spec(), 0); !ok || !tr.ver.Dirty {
				t.Errorf("trailer after a write = %+v (ok %v), want a valid dirty trailer", tr, ok)
			}
		})
	}
}

func TestCorruptExtentStaysDirtyAcrossFlushUntilRewritten(t *testing.T) {
	const bs = 512
	r := createRegion(t, testSpec(bs, 4, 2))
	oldData := pattern(28, 4, bs)
	mustWrite(t, r, 0, oldData)
	if err := r.Flush(1, 1); err != nil {
		t.Fatal(err)
	}
	r.faultHook = cutAt(stepAfterData)
	p := pattern(29, 1, bs)
	if err := r.WriteBlocks(1, p, hashesOf(p, bs)); !errors.Is(err, errPowerCut) {
		t.Fatal(err)
	}
	r = reopen(t, r)
	checkBlock(t, r, 1, nil, nil, readsCorrupt)

	// Writing other blocks and flushing does not vouch for block 1.
	mustWrite(t, r, 3, pattern(30, 1, bs))
	mustWrite(t, r, 4, pattern(31, 1, bs)) // extent 1
	if err := r.Flush(2, 2); err != nil {
		t.Fatal(err)
	}
	if v, _ := r.ExtentVersion(0); v != (Version{Gen: 1, Flush: 1, Dirty: true}) {
		t.Errorf("corrupt extent version after flush %+v, want old numbers and dirty", v)
	}
	if v, _ := r.ExtentVersion(1); v != (Version{Gen: 2, Flush: 2}) {
		t.Errorf("healthy extent version after flush %+v", v)
	}
	r = reopen(t, r)
	checkBlock(t, r, 1, nil, nil, readsCorrupt)
	checkBlock(t, r, 3, nil, pattern(30, 1, bs), readsNew)

	// Rewriting the corrupt block clears it; the next flush cleans the extent.
	mustWrite(t, r, 1, p)
	if got := r.CorruptBlocks(); len(got) != 0 {
		t.Errorf("CorruptBlocks after rewrite = %v", got)
	}
	if err := r.Flush(3, 2); err != nil {
		t.Fatal(err)
	}
	r = reopen(t, r)
	checkBlock(t, r, 1, nil, p, readsNew)
	if v, _ := r.ExtentVersion(0); v != (Version{Gen: 2, Flush: 3}) {
		t.Errorf("extent version after rewrite and flush %+v", v)
	}
}

// TestRandomPowerCutsNeverServeWrongData runs seeded random writes and
// flushes, cutting the power at a random step each round, and checks after
// every reopen that each block reads as its last flushed data, data written
// since, or ErrCorruptBlock.
func TestRandomPowerCutsNeverServeWrongData(t *testing.T) {
	const (
		bs     = 512
		blocks = 16
		rounds = 60
	)
	rng := rand.New(rand.NewPCG(42, 7))
	r := createRegion(t, testSpec(bs, 4, blocks/4))
	// allowed[b] holds the hashes block b may read back as.
	allowed := make([]map[uint64]bool, blocks)
	zero := xxhash.Sum64(make([]byte, bs))
	for b := range allowed {
		allowed[b] = map[uint64]bool{zero: true}
	}
	lastWritten := make([]uint64, blocks)
	for b := range lastWritten {
		lastWritten[b] = zero
	}
	flushNumber, corruptSeen := uint64(0), 0
	for round := range rounds {
		r.faultHook = cutAfter(1 + rng.Int64N(30))
		for op := 0; ; op++ {
			var err error
			if rng.IntN(4) == 0 {
				flushNumber++
				if err = r.Flush(flushNumber, 1); err == nil {
					for b := range allowed {
						allowed[b] = map[uint64]bool{lastWritten[b]: true}
					}
				}
			} else {
				first := rng.IntN(blocks)
				n := 1 + rng.IntN(min(6, blocks-first))
				p := pattern(rng.Uint64(), n, bs)
				h := hashesOf(p, bs)
				for i := range n {
					allowed[first+i][h[i]] = true
				}
				if err = r.WriteBlocks(ids.BlockIndex(first), p, h); err == nil {
					copy(lastWritten[first:], h)
				}
			}
			if errors.Is(err, errPowerCut) {
				break
			}
			if err != nil {
				t.Fatalf("round %d op %d: %v", round, op, err)
			}
		}
		r = reopen(t, r)
		for b := range blocks {
			got, err := readChecked(r, ids.BlockIndex(b), 1)
			if errors.Is(err, ErrCorruptBlock) {
				corruptSeen++
				continue
			}
			if err != nil {
				t.Fatalf("round %d: block %d: %v", round, b, err)
			}
			h := xxhash.Sum64(got)
			if !allowed[b][h] {
				t.Fatalf("round %d: block %d read back data never written to it", round, b)
			}
			// What is on disk now is what the block holds until written.
			allowed[b] = map[uint64]bool{h: true}
			lastWritten[b] = h
		}
		for _, b := range r.CorruptBlocks() {
			// A corrupt block holds nothing the replica may serve; keep
			// allowing what it might become if never rewritten.
			lastWritten[b] = ^uint64(0)
		}
	}
	t.Logf("%d rounds, last flush %d, %d corrupt block reads", rounds, flushNumber, corruptSeen)
}
