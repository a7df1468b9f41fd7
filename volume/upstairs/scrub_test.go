package upstairs

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"tern/volume/extent"
	"tern/volume/upstairs/engine"
)

// flipBit flips one bit of block's data in replica i's extent file (the
// replica must be stopped): damage at rest that its clean extent's
// recorded hash no longer matches.
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

// A bit flipped at rest in a replica's extent file goes unseen until the
// block is read from that replica; Scrub reads every block of every
// replica, finds it, and rewrites it there from a peer's good copy, so the
// replicas are identical on disk again.
func TestScrubRewritesABitFlippedOnDisk(t *testing.T) {
	cl, want := tornCluster(t)
	if err := cl.StartAll(); err != nil {
		t.Fatal(err)
	}
	targets := cl.Targets()
	u, err := New(tornConfig(t, cl, targets))
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	if err := u.Activate(ctxT(t), 2); err != nil {
		t.Fatalf("Activate: %v", err)
	}
	stopAndWaitLeft(t, cl, u, 1)
	flipBit(t, cl.RegionDir(1), 130)
	if err := cl.Start(1); err != nil {
		t.Fatal(err)
	}
	waitState(t, u, 1, engine.ReplicaActive)

	rep, err := u.Scrub(ctxT(t))
	if err != nil {
		t.Fatalf("Scrub: %v", err)
	}
	// Read repair rewrites the whole read that found the bad block: here
	// the extent holding it.
	if !slices.Equal(rep.Replicas, []int{0, 1, 2}) || rep.Blocks != 3*uint64(volumeBytes()/testBlockSize) || rep.Rewritten != testExtentBlocks {
		t.Fatalf("scrub %+v; want all three replicas, every block, one extent rewritten", rep)
	}
	if got := readVolume(t, u); !bytes.Equal(got, want) {
		t.Error("volume reads differ from the expected data")
	}
	if err := u.Close(); err != nil {
		t.Fatal(err)
	}
	// Block for block identical; replica 1's rewritten extent carries a
	// newer flush than its peers' (the scrub's flush stamped it), which
	// is allowed: equal versions must mean equal blocks, not the reverse.
	if err := cl.Close(); err != nil {
		t.Fatal(err)
	}
	for i := range engine.ReplicaCount {
		onDisk(t, cl, i, func(r *extent.Region) {
			got := make([]byte, len(want))
			hs := make([]uint64, len(want)/testBlockSize)
			if err := r.ReadBlocks(0, got, hs); err != nil {
				t.Fatalf("replica %d: %v", i, err)
			}
			for b := range hs {
				p := got[b*testBlockSize : (b+1)*testBlockSize]
				if !blockMatches(p, hs[b]) || !bytes.Equal(p, want[b*testBlockSize:(b+1)*testBlockSize]) {
					t.Errorf("replica %d block %d differs from the expected data or its hash", i, b)
				}
			}
		})
	}
}
