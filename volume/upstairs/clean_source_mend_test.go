package upstairs

import (
	"bytes"
	"errors"
	"testing"

	"tern/volume/extent"
	"tern/volume/ids"
	"tern/volume/internal/fixes"
	"tern/volume/wire"
)

// A takeover's activation copies an extent from a clean source whose
// block was damaged at rest (a bit flip goes unseen in a clean extent):
// the destination refuses the block, the source is mended from the peer
// that recorded the same hash, and the copy is tried again. The
// simulation found the next step (whole-volume-crash campaign, then seed
// 1495: "takeover activation at gen 2 failed: repair write failed: error
// hash mismatch"): the same block is damaged again after its mend, before
// the copy, and the activation failed. The source is now mended again
// (reconcile.MendSourceAgain), so the activation succeeds; with that fix
// undone, or the first mend undone, it fails as before.
func TestActivationMendsACleanSourceDamagedAgainAfterItsMend(t *testing.T) {
	for _, tc := range []struct {
		name string
		undo []fixes.Fix
	}{
		{name: "as_fixed"},
		{name: "second_mend_undone", undo: []fixes.Fix{fixes.MendSourceTwice}},
		{name: "clean_source_mend_undone", undo: []fixes.Fix{fixes.MendCleanSource}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, f := range tc.undo {
				defer fixes.Undo(f)()
			}
			cl, want := tornCluster(t)
			// Replicas 0 and 2 flushed blocks 3 and 4 further (1/2);
			// replica 1 missed them (1/1): extent 0's source is replica
			// 0, clean, and its only destination replica 1.
			for _, i := range []int{0, 2} {
				model := want
				if i == 2 {
					model = nil
				}
				onDisk(t, cl, i, func(r *extent.Region) {
					writeSeed(t, r, model, 3, 2, 2)
					if err := r.Flush(2, 1); err != nil {
						t.Fatal(err)
					}
				})
			}
			const block = 3
			flipBit(t, cl.RegionDir(0), block)
			if err := cl.StartAll(); err != nil {
				t.Fatal(err)
			}
			u, err := New(tornConfig(t, cl, cl.Targets()))
			if err != nil {
				t.Fatal(err)
			}
			defer u.Close()
			mends := 0
			u.hooks = &repairHooks{sourceMended: func(src int, e ids.ExtentID) {
				if mends++; mends == 1 && src == 0 && e == 0 {
					// Damaged again, on the running replica, before
					// the copy reads it.
					flipBit(t, cl.RegionDir(0), block)
				}
			}}
			err = u.Activate(ctxT(t), 2)
			if len(tc.undo) > 0 {
				if err == nil || !errors.Is(err, wire.CodeHashMismatch) {
					t.Fatalf("Activate with %v undone = %v; want the destination's hash mismatch", tc.undo, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Activate: %v", err)
			}
			if mends != 2 {
				t.Errorf("the source was mended %d times; want 2", mends)
			}
			if got := readVolume(t, u); !bytes.Equal(got, want) {
				t.Error("volume reads differ from the expected data")
			}
			if err := u.Close(); err != nil {
				t.Fatal(err)
			}
			requireIdenticalOnDisk(t, cl, want)
		})
	}
}
