// Package ids defines the numbers every volume package uses to name the
// parts of a region and the sessions that write it: BlockIndex (a block,
// counted across the whole region), ExtentID (an extent) and Generation
// (an activation generation). The replica's files (volume/extent), the
// protocol (volume/wire), the planners (volume/reconcile), the replica
// server and the upstairs all use these types, so a value passes between
// them without a conversion. The index of a block within one extent is a
// different number and has its own type, reconcile.ExtentBlock.
//
// The package has no dependencies and no behaviour beyond its types.
package ids

// BlockIndex is the index of a block in a region, counted from zero across
// all extents (extent e's first block is e × the extent's block count).
type BlockIndex uint64

// ExtentID is the index of an extent in a region, counted from zero.
type ExtentID uint32

// Generation is an activation generation: the number an upstairs activates
// a region with. A downstairs stores the highest it has seen durably,
// serves the session that activated with it and fences every lower one.
type Generation uint64
