package devices

import (
	"context"
	"fmt"
)

// VolumeIO is the IO of a replicated volume: volume/upstairs.Upstairs
// implements it. ReadAt reads straight into p and WriteAt returns only
// once p is no longer needed (two replicas applied it, the third works
// from a private copy), so guest buffers can be handed over in place.
type VolumeIO interface {
	ReadAt(ctx context.Context, p []byte, off int64) (int, error)
	WriteAt(ctx context.Context, p []byte, off int64) (int, error)
	Flush(ctx context.Context) error
}

// VolumeBackend is a BlockBackend over a replicated volume: virtio-blk's
// reads and writes go to the volume's ReadAt and WriteAt with the guest's
// own buffers, and FLUSH to its Flush (durable on two replicas).
type VolumeBackend struct {
	// Immutable after construction.
	v         VolumeIO
	blockSize int
	size      uint64
}

// NewVolumeBackend returns a backend over v, whose blocks are blockSize
// bytes and which holds sizeBytes.
func NewVolumeBackend(v VolumeIO, blockSize int, sizeBytes uint64) (*VolumeBackend, error) {
	if blockSize < 512 || blockSize&(blockSize-1) != 0 {
		return nil, fmt.Errorf("creating volume disk: block size %d is not a power of two >= 512", blockSize)
	}
	if sizeBytes == 0 || sizeBytes%uint64(blockSize) != 0 {
		return nil, fmt.Errorf("creating volume disk: size %d is not a positive multiple of the block size %d", sizeBytes, blockSize)
	}
	return &VolumeBackend{v: v, blockSize: blockSize, size: sizeBytes}, nil
}

// ReadAt reads into p at off.
func (b *VolumeBackend) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	return b.v.ReadAt(ctx, p, off)
}

// WriteAt writes p at off.
func (b *VolumeBackend) WriteAt(ctx context.Context, p []byte, off int64) (int, error) {
	return b.v.WriteAt(ctx, p, off)
}

// Flush makes every acknowledged write durable.
func (b *VolumeBackend) Flush(ctx context.Context) error { return b.v.Flush(ctx) }

// BlockSize returns the volume's block size.
func (b *VolumeBackend) BlockSize() int { return b.blockSize }

// SizeBytes returns the volume's size.
func (b *VolumeBackend) SizeBytes() uint64 { return b.size }
