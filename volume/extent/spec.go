package extent

import (
	"errors"
	"fmt"

	"github.com/google/uuid"

	"tern/volume/ids"
)

// Version is an extent's trailer: what reconciliation compares across
// replicas to decide which extents need repair.
type Version struct {
	// Gen is the activation generation of the last flush (or repair) that
	// cleaned the extent.
	Gen ids.Generation
	// Flush is the flush number of that flush.
	Flush uint64
	// Dirty is true when the extent may hold writes (or damage) no flush has
	// vouched for.
	Dirty bool
}

// Region format and size limits.
const (
	// FormatVersion1 is the only on-disk format this package reads and
	// writes (see doc.go).
	FormatVersion1 = 1
	// DefaultExtentBytes is the extent size the design uses in production
	// (64 MiB, as Omicron does for Crucible).
	DefaultExtentBytes = 64 << 20
	// MaxExtentBytes bounds one extent file's block data (512 MiB, as
	// Crucible does), which bounds open-time verification per extent.
	MaxExtentBytes = 512 << 20
	// MaxExtentCount bounds the number of extent files in one region.
	MaxExtentCount = 1 << 20
)

// Spec describes a region; it is stored as region.json in the region's
// directory. A Spec is plain data: validate it with Validate before use.
type Spec struct {
	// UUID identifies the region (shared by the three replicas of a volume).
	UUID uuid.UUID `json:"uuid"`
	// BlockSize is the block size in bytes: 512 or 4096.
	BlockSize uint32 `json:"block_size"`
	// ExtentBlocks is the number of blocks in each extent.
	ExtentBlocks uint32 `json:"extent_blocks"`
	// ExtentCount is the number of extents.
	ExtentCount uint32 `json:"extent_count"`
	// FormatVersion is the on-disk format; FormatVersion1.
	FormatVersion uint32 `json:"format_version"`
}

// NewSpec returns a Spec with a fresh random UUID and the current format
// version. It does not validate.
func NewSpec(blockSize, extentBlocks, extentCount uint32) Spec {
	return Spec{
		UUID:          uuid.New(),
		BlockSize:     blockSize,
		ExtentBlocks:  extentBlocks,
		ExtentCount:   extentCount,
		FormatVersion: FormatVersion1,
	}
}

// Validate reports every problem with s at once (joined with errors.Join);
// each problem wraps ErrInvalidSpec.
func (s Spec) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidSpec}, args...)...))
	}
	if s.UUID == uuid.Nil {
		bad("uuid is nil")
	}
	if s.BlockSize != 512 && s.BlockSize != 4096 {
		bad("block size %d is not 512 or 4096", s.BlockSize)
	}
	switch {
	case s.ExtentBlocks == 0:
		bad("extent blocks is 0")
	case uint64(s.ExtentBlocks)*uint64(max(s.BlockSize, 512)) > MaxExtentBytes:
		bad("extent of %d blocks exceeds %d bytes", s.ExtentBlocks, MaxExtentBytes)
	}
	switch {
	case s.ExtentCount == 0:
		bad("extent count is 0")
	case s.ExtentCount > MaxExtentCount:
		bad("extent count %d exceeds %d", s.ExtentCount, MaxExtentCount)
	}
	if s.FormatVersion != FormatVersion1 {
		bad("format version %d is not %d", s.FormatVersion, FormatVersion1)
	}
	return errors.Join(errs...)
}

// Blocks returns the number of blocks in the region.
func (s Spec) Blocks() uint64 { return uint64(s.ExtentBlocks) * uint64(s.ExtentCount) }

// SizeBytes returns the region's size in bytes.
func (s Spec) SizeBytes() uint64 { return s.Blocks() * uint64(s.BlockSize) }

// ExtentBytes returns the size of one extent's block data in bytes.
func (s Spec) ExtentBytes() uint64 { return uint64(s.ExtentBlocks) * uint64(s.BlockSize) }

// SpecForSize returns a Spec (fresh UUID, current format) for a region of
// at least sizeBytes: extents of DefaultExtentBytes, or a single smaller
// extent when the region is smaller than that. The size is rounded up to
// whole blocks and extents. The result is validated.
func SpecForSize(sizeBytes uint64, blockSize uint32) (Spec, error) {
	if sizeBytes == 0 {
		return Spec{}, fmt.Errorf("size region: %w: size is 0", ErrInvalidSpec)
	}
	if blockSize != 512 && blockSize != 4096 {
		return Spec{}, fmt.Errorf("size region: %w: block size %d is not 512 or 4096", ErrInvalidSpec, blockSize)
	}
	blocks := (sizeBytes + uint64(blockSize) - 1) / uint64(blockSize)
	extentBlocks := uint64(DefaultExtentBytes / blockSize)
	if blocks < extentBlocks {
		extentBlocks = blocks
	}
	count := (blocks + extentBlocks - 1) / extentBlocks
	if count > MaxExtentCount {
		return Spec{}, fmt.Errorf("size region: %w: %d bytes needs %d extents, more than %d", ErrInvalidSpec, sizeBytes, count, MaxExtentCount)
	}
	s := NewSpec(blockSize, uint32(extentBlocks), uint32(count))
	if err := s.Validate(); err != nil {
		return Spec{}, fmt.Errorf("size region: %w", err)
	}
	return s, nil
}
