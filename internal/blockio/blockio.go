package blockio

import "context"

// Device is a block device's IO. Calls may run concurrently. Offsets and
// lengths are multiples of BlockSize within SizeBytes.
//
// ReadAt reads straight into p, and WriteAt returns only once p is no
// longer needed, so a caller may hand over guest memory in place (and
// must not expect p to be kept after the call). A write is complete when
// WriteAt returns; Flush makes every write completed before it durable.
type Device interface {
	ReadAt(ctx context.Context, p []byte, off int64) (int, error)
	WriteAt(ctx context.Context, p []byte, off int64) (int, error)
	Flush(ctx context.Context) error
	// BlockSize is the block size in bytes (a power of two, at least
	// 512); SizeBytes the device's size, a multiple of it. A volume
	// reports 0 for both until its geometry is known (configured, or
	// agreed at activation).
	BlockSize() int
	SizeBytes() uint64
}
