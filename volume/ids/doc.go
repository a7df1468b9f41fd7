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
