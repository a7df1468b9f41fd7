package reconcile

import (
	"slices"
	"testing"

	"tern/volume/ids"
	"tern/volume/internal/fixes"
)

func TestNewestFirstOrdersDonorsByVersionThenID(t *testing.T) {
	v := func(gen ids.Generation, flush uint64, dirty bool) Version {
		return Version{Gen: gen, Flush: flush, Dirty: dirty}
	}
	// Given out of ID order: replica 2 newest, 0 and 1 equal, src 1.
	present := []ReplicaVersions{
		{Replica: 2, Extents: []Version{v(1, 1, false), v(1, 5, true)}},
		{Replica: 0, Extents: []Version{v(1, 1, false), v(1, 3, false)}},
		{Replica: 1, Extents: []Version{v(1, 1, false), v(1, 3, false)}},
	}
	for _, tc := range []struct {
		extent uint32
		src    ReplicaID
		want   []ReplicaID
		undo   bool
	}{
		{extent: 1, src: 1, want: []ReplicaID{2, 0}},
		{extent: 1, src: 2, want: []ReplicaID{0, 1}},
		{extent: 0, src: 0, want: []ReplicaID{1, 2}},
		{extent: 1, src: 1, want: []ReplicaID{0, 2}, undo: true}, // the fix undone: ID order
	} {
		if tc.undo {
			restore := fixes.Undo(fixes.NewestDonorFirst)
			defer restore()
		}
		got := NewestFirst(present, ids.ExtentID(tc.extent), tc.src)
		if !slices.Equal(got, tc.want) {
			t.Errorf("NewestFirst(extent %d, src %d, undone %v) = %v; want %v", tc.extent, tc.src, tc.undo, got, tc.want)
		}
	}
}

func TestMendSourceAgainIsBoundedAndNeedsProgress(t *testing.T) {
	for _, tc := range []struct {
		clean      bool
		mends      int
		lastMended bool
		undo       []fixes.Fix
		want       bool
	}{
		{clean: false, mends: 0, want: false},
		{clean: true, mends: 0, want: true},
		{clean: true, mends: 1, lastMended: true, want: true},
		{clean: true, mends: 1, lastMended: false, want: false},
		{clean: true, mends: MaxSourceMends - 1, lastMended: true, want: true},
		{clean: true, mends: MaxSourceMends, lastMended: true, want: false},
		{clean: true, mends: 0, undo: []fixes.Fix{fixes.MendCleanSource}, want: false},
		{clean: true, mends: 0, undo: []fixes.Fix{fixes.MendSourceTwice}, want: true},
		{clean: true, mends: 1, lastMended: true, undo: []fixes.Fix{fixes.MendSourceTwice}, want: false},
	} {
		var restore []func()
		for _, f := range tc.undo {
			restore = append(restore, fixes.Undo(f))
		}
		got := MendSourceAgain(tc.clean, tc.mends, tc.lastMended)
		for _, r := range restore {
			r()
		}
		if got != tc.want {
			t.Errorf("MendSourceAgain(clean %v, mends %d, last mended %v; undone %v) = %v; want %v",
				tc.clean, tc.mends, tc.lastMended, tc.undo, got, tc.want)
		}
	}
}

func TestRecordedAlikeSplitsByThePeersRecordedHash(t *testing.T) {
	src := []uint64{10, 11, 12, 13}
	peer := []uint64{10, 99, 12}
	same, other := RecordedAlike([]uint32{0, 1, 2, 3}, src, peer)
	if !slices.Equal(same, []uint32{0, 2}) || !slices.Equal(other, []uint32{1, 3}) {
		t.Errorf("RecordedAlike = %v, %v; want [0 2], [1 3] (block 3 is past the peer's list)", same, other)
	}
}
