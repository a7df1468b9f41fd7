package extent

import (
	"errors"
	"fmt"
	"tern/volume/ids"

	"golang.org/x/sys/unix"
)

// Sentinel errors. Every error the package returns wraps at most one of
// these, so callers branch with errors.Is.
var (
	// ErrOutOfRange reports blocks or an extent outside the region.
	ErrOutOfRange = errors.New("out of range")
	// ErrUnaligned reports a buffer that is not a whole number of blocks
	// or whose length disagrees with the number of hashes or block numbers.
	ErrUnaligned = errors.New("buffer not aligned to blocks")
	// ErrHashMismatch reports a block whose data does not hash to the value
	// the caller supplied; nothing of that write was applied.
	ErrHashMismatch = errors.New("block hash mismatch")
	// ErrCorruptBlock reports a block whose data did not match its recorded
	// hash after a crash (or whose write failed half way); it is never
	// served until it is written again or repaired.
	ErrCorruptBlock = errors.New("block corrupt")
	// ErrNoRegion reports a directory that holds no region.
	ErrNoRegion = errors.New("no region")
	// ErrRegionExists reports a Create over a directory that already holds
	// a region.
	ErrRegionExists = errors.New("region already exists")
	// ErrReadOnly reports a write to a region whose files cannot be written
	// (EROFS, EACCES, EPERM), including a region opened on a read-only mount.
	ErrReadOnly = errors.New("region is read-only")
	// ErrNoSpace reports a write that the file system refused for lack of
	// space or quota (ENOSPC, EDQUOT).
	ErrNoSpace = errors.New("no space for region")
	// ErrClosed reports a call on a closed Region.
	ErrClosed = errors.New("region closed")
	// ErrInvalidSpec is wrapped by every problem Spec.Validate reports.
	ErrInvalidSpec = errors.New("invalid region spec")
	// ErrBadRegion reports region files damaged in a way no crash of this
	// package can produce (missing extent file, wrong file size, unreadable
	// region.json); the replica must be replaced, not reopened.
	ErrBadRegion = errors.New("region damaged")
	// ErrInUse reports a region already opened by another Region value or
	// process (the region directory is locked with flock).
	ErrInUse = errors.New("region in use")
	// ErrStaleGeneration reports SetHighestGen with a generation lower than
	// one already accepted.
	ErrStaleGeneration = errors.New("generation lower than highest accepted")
)

// BlockError names the block a per-block error is about. Err is
// ErrCorruptBlock or ErrHashMismatch; errors.Is sees through to it.
type BlockError struct {
	// Block is the region-wide block number.
	Block ids.BlockIndex
	// Err is the reason: ErrCorruptBlock or ErrHashMismatch.
	Err error
}

// Error implements error.
func (e *BlockError) Error() string { return fmt.Sprintf("block %d: %v", e.Block, e.Err) }

// Unwrap returns the reason so errors.Is(err, ErrCorruptBlock) works.
func (e *BlockError) Unwrap() error { return e.Err }

// sysError is an operating-system error classified as ErrReadOnly or
// ErrNoSpace; its text is the OS error's, and errors.Is matches both the
// class and the errno.
type sysError struct {
	class error
	err   error
}

func (e *sysError) Error() string   { return e.err.Error() }
func (e *sysError) Unwrap() []error { return []error{e.class, e.err} }

// classify attaches ErrReadOnly or ErrNoSpace to an OS error when its errno
// is one callers must branch on; other errors are returned unchanged.
func classify(err error) error {
	if err == nil {
		return nil
	}
	switch {
	case errors.Is(err, unix.EROFS), errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM):
		return &sysError{class: ErrReadOnly, err: err}
	case errors.Is(err, unix.ENOSPC), errors.Is(err, unix.EDQUOT):
		return &sysError{class: ErrNoSpace, err: err}
	}
	return err
}
