package reconcile

import (
	"cmp"
	"fmt"

	"tern/volume/ids"
)

// ReplicaCount is the number of replicas (downstairs) behind one upstairs.
const ReplicaCount = 3

// ReplicaID names one of the three replicas of a region, 0 to
// ReplicaCount-1. It is the position of the downstairs in the upstairs'
// target list, so the same replica keeps its ID across reconnections.
type ReplicaID int

// Valid reports whether id names one of the ReplicaCount replicas.
func (id ReplicaID) Valid() bool { return id >= 0 && id < ReplicaCount }

// ExtentBlock is the index of a block within one extent, counted from zero
// at the extent's first block. It is not a region-wide ids.BlockIndex:
// block b of extent e is region block e × the extent's block count + b.
type ExtentBlock uint32

// Version is the durable state of one extent on one replica, as the extent
// file's trailer records it: the generation and flush number of the last
// flush, and whether the extent was written since.
type Version struct {
	// Gen is the activation generation of the last flush.
	Gen ids.Generation
	// Flush is the flush number of the last flush.
	Flush uint64
	// Dirty reports a write since the last flush.
	Dirty bool
}

// Compare orders versions by Gen, then Flush, then Dirty (dirty after
// clean). It returns -1 if v sorts before w, +1 if after, 0 if equal.
//
// A dirty extent sorts after a clean one with the same numbers because it
// holds every write the clean copy holds plus writes made since that flush;
// this is the order Crucible's reconciliation uses to pick a source.
func (v Version) Compare(w Version) int {
	switch {
	case v.Gen != w.Gen:
		return cmp.Compare(v.Gen, w.Gen)
	case v.Flush != w.Flush:
		return cmp.Compare(v.Flush, w.Flush)
	case v.Dirty == w.Dirty:
		return 0
	case v.Dirty:
		return 1
	default:
		return -1
	}
}

// String formats v as "gen/flush" with a "+dirty" suffix when dirty.
func (v Version) String() string {
	if v.Dirty {
		return fmt.Sprintf("%d/%d+dirty", v.Gen, v.Flush)
	}
	return fmt.Sprintf("%d/%d", v.Gen, v.Flush)
}
