package ec

import "tern/volume"

// The errors an erasure-coded volume shares with every layout (the
// volume package's), so a caller branches on them the same way for
// either.
var (
	// ErrFenced: another upstairs activated the shards with a higher
	// generation.
	ErrFenced = volume.ErrFenced
	// ErrClosed: the volume was closed.
	ErrClosed = volume.ErrClosed
	// ErrRegionMismatch: a shard serves another region than asked for, or
	// shards disagree on the geometry.
	ErrRegionMismatch = volume.ErrRegionMismatch
	// ErrGenTooLow: a shard refused the activation generation.
	ErrGenTooLow = volume.ErrGenTooLow
	// ErrInvalidConfig: New was given a configuration it cannot use.
	ErrInvalidConfig = volume.ErrInvalidConfig
	// ErrNotEnoughShards: fewer shards than data shards can take the IO
	// (returned only when the caller's context ends while it waits).
	ErrNotEnoughShards = volume.ErrNotEnoughDownstairs
)
