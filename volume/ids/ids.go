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
