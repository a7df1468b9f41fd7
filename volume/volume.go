package volume

import (
	"context"
	"errors"
	"fmt"
	"time"

	"tern/internal/blockio"

	"tern/volume/ids"
	"tern/volume/reconcile"
)

// Volume is a block volume, whichever its layout: the block IO every
// device offers (blockio.Device: ReadAt, WriteAt, Flush, BlockSize,
// SizeBytes; here a range outside SizeBytes fails with ErrOutOfRange and
// one not aligned to BlockSize with ErrUnaligned), and what a volume adds
// to it. Calls may run concurrently.
type Volume interface {
	blockio.Device
	// Discard says the range's contents are no longer needed; it reads
	// back as zeroes afterwards. WriteZeroes makes the range read back
	// as zeroes. Both write zeroes for now (no wire operation yet).
	Discard(ctx context.Context, off, length int64) error
	WriteZeroes(ctx context.Context, off, length int64) error

	// Activate takes the volume's downstairs at generation gen (fencing
	// every lower one) and reconciles them; IO is refused before.
	Activate(ctx context.Context, gen ids.Generation) error
	// ActivationProgress is the activation's progress; SubscribeActivation
	// sends each change of it on a channel of the given buffer until the
	// returned cancel is called.
	ActivationProgress() reconcile.Progress
	SubscribeActivation(buffer int) (<-chan reconcile.Progress, func())
	// Summary is the layout-neutral status; each layout's own Status has
	// its details.
	Summary() Status

	// Close flushes what is in flight (bounded by the deactivate
	// timeout), then frees the volume; later calls fail with ErrClosed.
	Close() error
}

// Status is a volume as any layout describes it.
type Status struct {
	// Layout is "replicated" or "ec:K+M".
	Layout string
	// Active is true between a successful Activate and Close or fencing.
	Active bool
	Gen    ids.Generation
	// SizeBytes is the client-visible size (0 before it is known).
	SizeBytes uint64
	// Downstairs are the replicas or shards, in target order.
	Downstairs []DownstairsStatus
	// Err is why IO stopped (fenced, closed), if it did.
	Err        error
	Activation reconcile.Progress
}

// DownstairsStatus is one replica or shard of a volume.
type DownstairsStatus struct {
	Target string
	// State is the layout's name for the downstairs' state ("active",
	// "offline", ...).
	State string
	// Serving is true when the downstairs takes the volume's IO.
	Serving     bool
	LastError   string
	FaultReason string
	// Repair is its current or latest repair; nil if none ran.
	Repair *reconcile.Progress
}

// Errors a caller branches on whichever the layout (each layout wraps
// these, and may add its own).
var (
	// ErrClosed: the volume was closed.
	ErrClosed = errors.New("upstairs closed")
	// ErrFenced: another client activated the downstairs with a higher
	// generation; this one may no longer do IO.
	ErrFenced = errors.New("upstairs fenced by a higher generation")
	// ErrRegionMismatch: downstairs disagree on the region's identity or
	// geometry, or it differs from the configured one.
	ErrRegionMismatch = errors.New("region mismatch")
	// ErrGenTooLow: a downstairs refused the activation generation.
	ErrGenTooLow = errors.New("activation generation too low")
	// ErrInvalidConfig: a layout was given a configuration it cannot use.
	ErrInvalidConfig = errors.New("invalid upstairs config")
	// ErrNotEnoughDownstairs: too few replicas or shards can take the IO.
	ErrNotEnoughDownstairs = errors.New("not enough replicas")
	// ErrUnaligned: an offset or length is not a multiple of the block
	// size.
	ErrUnaligned = errors.New("unaligned IO")
	// ErrOutOfRange: the IO reaches past the end of the volume.
	ErrOutOfRange = errors.New("IO out of range")
)

// Defaults the layouts give the zero values of their configurations.
const (
	// DefaultActivationQuorumWait is how long Activate waits for every
	// downstairs before it goes ahead with a quorum.
	DefaultActivationQuorumWait = 5 * time.Second
	// DefaultReconnectMin and DefaultReconnectMax bound the reconnect
	// backoff to a downstairs.
	DefaultReconnectMin = 50 * time.Millisecond
	DefaultReconnectMax = 2 * time.Second
	// DefaultDeactivateTimeout bounds the flush and drain Close does.
	DefaultDeactivateTimeout = 10 * time.Second
	// DefaultReplyTimeout is how long a downstairs may leave a request
	// unanswered on a live connection before it is dropped.
	DefaultReplyTimeout = 10 * time.Second
)

// maxZeroChunk bounds the zero buffer WriteZeroesAsWrites writes from.
const maxZeroChunk = 1 << 20

// WriteZeroesAsWrites writes zeroes over [off, off+length) with write (a
// layout's WriteAt), at most 1 MiB at a time: how a layout without a wire
// operation for it serves Discard and WriteZeroes. The range must be
// block aligned (bs, known: activated) and within a volume of size bytes.
func WriteZeroesAsWrites(ctx context.Context, write func(ctx context.Context, p []byte, off int64) (int, error),
	bs int, size uint64, off, length int64) error {
	if err := CheckRange(bs, size, off, length); err != nil {
		return err
	}
	chunk := min(length, maxZeroChunk/int64(bs)*int64(bs))
	zero := make([]byte, chunk)
	for done := int64(0); done < length; done += chunk {
		n := min(chunk, length-done)
		if _, err := write(ctx, zero[:n], off+done); err != nil {
			return fmt.Errorf("writing zeroes at %d: %w", off+done, err)
		}
	}
	return nil
}

// CheckRange checks that [off, off+length) is block aligned for block
// size bs and within a volume of size bytes. A layout checks that it is
// activated (bs known) first.
func CheckRange(bs int, size uint64, off, length int64) error {
	if bs <= 0 {
		return fmt.Errorf("IO at %d: block size %d: %w", off, bs, ErrUnaligned)
	}
	if off < 0 || length < 0 || off%int64(bs) != 0 || length%int64(bs) != 0 {
		return fmt.Errorf("IO of %d bytes at %d with %d-byte blocks: %w", length, off, bs, ErrUnaligned)
	}
	if uint64(off)+uint64(length) > size {
		return fmt.Errorf("IO of %d bytes at %d past the volume's %d bytes: %w", length, off, size, ErrOutOfRange)
	}
	return nil
}
