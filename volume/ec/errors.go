package ec

import "tern/volume/upstairs"

// The errors an erasure-coded volume shares with the replicated one, so a
// caller branches on them the same way for either.
var (
	// ErrFenced: another upstairs activated the shards with a higher
	// generation.
	ErrFenced = upstairs.ErrFenced
	// ErrClosed: the volume was closed.
	ErrClosed = upstairs.ErrClosed
	// ErrRegionMismatch: a shard serves another region than asked for, or
	// shards disagree on the geometry.
	ErrRegionMismatch = upstairs.ErrRegionMismatch
	// ErrGenTooLow: a shard refused the activation generation.
	ErrGenTooLow = upstairs.ErrGenTooLow
	// ErrInvalidConfig: New was given a configuration it cannot use.
	ErrInvalidConfig = upstairs.ErrInvalidConfig
	// ErrNotEnoughShards: fewer shards than data shards can take the IO
	// (returned only when the caller's context ends while it waits).
	ErrNotEnoughShards = upstairs.ErrNotEnoughReplicas
)
