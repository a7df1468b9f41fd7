package engine

import (
	"errors"

	"tern/volume"
)

// Errors the engine decides. Callers branch on them like on the others
// (errors.go).
var (
	// ErrNotActive: the upstairs is not activated (or was closed).
	ErrNotActive = errors.New("upstairs not active")
	// ErrNotEnoughReplicas: fewer than two replicas can take a write or
	// flush, or none can serve a read (the volume package's, shared
	// with every layout).
	ErrNotEnoughReplicas = volume.ErrNotEnoughDownstairs
	// ErrCorrupt: no replica returned a block matching its hash.
	ErrCorrupt = errors.New("corrupt data on every replica")
	// ErrRestarted: a flush was in flight when every replica restarted;
	// writes acknowledged before it and not flushed may have been lost
	// (restart reconciliation), so it cannot promise they are durable.
	// Writes still in flight are replayed, not failed.
	ErrRestarted = errors.New("every replica restarted: writes acknowledged before this flush may be lost")
)
