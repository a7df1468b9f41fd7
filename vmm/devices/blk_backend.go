package devices

import (
	"context"
	"fmt"
	"os"
)

// FileBackend is a block device (blockio.Device) over a local file, read and written with
// pread/pwrite straight into and out of the caller's slices.
type FileBackend struct {
	// Immutable after construction.
	f         *os.File
	blockSize int
	size      uint64
}

// OpenFileBackend opens path for reading and writing with the given block
// size; the disk's size is the file's size rounded down to a block.
func OpenFileBackend(path string, blockSize int) (*FileBackend, error) {
	if blockSize < 512 || blockSize&(blockSize-1) != 0 {
		return nil, fmt.Errorf("opening disk %s: block size %d is not a power of two >= 512", path, blockSize)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("opening disk: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("opening disk: %w", err)
	}
	size := uint64(st.Size()) &^ uint64(blockSize-1)
	return &FileBackend{f: f, blockSize: blockSize, size: size}, nil
}

// ReadAt reads into p at off.
func (b *FileBackend) ReadAt(_ context.Context, p []byte, off int64) (int, error) {
	return b.f.ReadAt(p, off)
}

// WriteAt writes p at off.
func (b *FileBackend) WriteAt(_ context.Context, p []byte, off int64) (int, error) {
	return b.f.WriteAt(p, off)
}

// Flush makes written data durable (fsync).
func (b *FileBackend) Flush(context.Context) error { return b.f.Sync() }

// BlockSize returns the block size given at open.
func (b *FileBackend) BlockSize() int { return b.blockSize }

// SizeBytes returns the disk's size.
func (b *FileBackend) SizeBytes() uint64 { return b.size }

// Close closes the file.
func (b *FileBackend) Close() error { return b.f.Close() }
