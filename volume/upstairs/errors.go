package upstairs

import (
	"errors"

	"tern/volume"
	"tern/volume/upstairs/engine"
)

// Errors callers branch on. Every error the upstairs returns wraps one of
// these or a context error. The first four are decided by the job engine
// and are its values, most others are the volume package's, shared with
// every layout (errors.Is matches either name).
var (
	// ErrNotActive: the upstairs is not activated (or was closed).
	ErrNotActive = engine.ErrNotActive
	// ErrNotEnoughReplicas: fewer than two replicas can take a write or
	// flush, or none can serve a read.
	ErrNotEnoughReplicas = engine.ErrNotEnoughReplicas
	// ErrCorrupt: no replica returned a block matching its hash.
	ErrCorrupt = engine.ErrCorrupt
	// ErrRestarted: a flush was in flight when every replica restarted;
	// writes acknowledged before it and not flushed may have been lost.
	ErrRestarted = engine.ErrRestarted

	// ErrUnaligned: an offset or length is not a multiple of the block size.
	ErrUnaligned = volume.ErrUnaligned
	// ErrOutOfRange: the IO reaches past the end of the volume.
	ErrOutOfRange = volume.ErrOutOfRange
	// ErrClosed: the upstairs was closed.
	ErrClosed = volume.ErrClosed
	// ErrFenced: another upstairs activated the region with a higher
	// generation; this one may no longer do IO.
	ErrFenced = volume.ErrFenced
	// ErrRegionMismatch: replicas disagree on the region's identity or
	// geometry, or it differs from the configured one.
	ErrRegionMismatch = volume.ErrRegionMismatch
	// ErrGenTooLow: a downstairs refused the activation generation.
	ErrGenTooLow = volume.ErrGenTooLow
	// ErrProtocol: a downstairs broke the protocol: it answered a job it
	// was not sent (or twice), with the wrong reply type or size, or sent
	// a reply nobody asked for. The replica is faulted.
	ErrProtocol = errors.New("downstairs broke the protocol")
	// ErrInvalidConfig: Config failed validation.
	ErrInvalidConfig = volume.ErrInvalidConfig
)
