package upstairs

import "errors"

// Errors callers branch on. Every error the upstairs returns wraps one of
// these or a context error.
var (
	// ErrUnaligned: an offset or length is not a multiple of the block size.
	ErrUnaligned = errors.New("unaligned IO")
	// ErrOutOfRange: the IO reaches past the end of the volume.
	ErrOutOfRange = errors.New("IO out of range")
	// ErrClosed: the upstairs was closed.
	ErrClosed = errors.New("upstairs closed")
	// ErrFenced: another upstairs activated the region with a higher
	// generation; this one may no longer do IO.
	ErrFenced = errors.New("upstairs fenced by a higher generation")
	// ErrRegionMismatch: replicas disagree on the region's identity or
	// geometry, or it differs from the configured one.
	ErrRegionMismatch = errors.New("region mismatch")
	// ErrGenTooLow: a downstairs refused the activation generation.
	ErrGenTooLow = errors.New("activation generation too low")
	// ErrProtocol: a downstairs broke the protocol: it answered a job it
	// was not sent (or twice), with the wrong reply type or size, or sent
	// a reply nobody asked for. The replica is faulted.
	ErrProtocol = errors.New("downstairs broke the protocol")
	// ErrInvalidConfig: Config failed validation.
	ErrInvalidConfig = errors.New("invalid upstairs config")
)
