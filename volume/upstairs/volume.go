package upstairs

import (
	"context"

	"tern/volume"
	"tern/volume/upstairs/engine"
)

var _ volume.Volume = (*Upstairs)(nil)

// BlockSize is the region's block size, 0 before activation.
func (u *Upstairs) BlockSize() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.blockSize
}

// SizeBytes is the region's size in bytes, 0 before activation.
func (u *Upstairs) SizeBytes() uint64 {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.region.Blocks() * uint64(u.blockSize)
}

// Discard writes zeroes over [off, off+length) (block aligned): the wire
// has no discard yet.
func (u *Upstairs) Discard(ctx context.Context, off, length int64) error {
	return u.WriteZeroes(ctx, off, length)
}

// WriteZeroes writes zeroes over [off, off+length) (block aligned), as
// ordinary writes until the wire has an operation for it.
func (u *Upstairs) WriteZeroes(ctx context.Context, off, length int64) error {
	u.mu.Lock()
	bs, size := u.blockSize, u.region.Blocks()*uint64(u.blockSize)
	u.mu.Unlock()
	if bs == 0 {
		return ErrNotActive
	}
	return volume.WriteZeroesAsWrites(ctx, u.WriteAt, bs, size, off, length)
}

// Summary is the upstairs' layout-neutral status: its replicas as its
// downstairs, serving while Active.
func (u *Upstairs) Summary() volume.Status {
	st := u.Status()
	s := volume.Status{
		Layout: "replicated", Active: st.Active, Gen: st.Gen,
		SizeBytes: st.Region.Blocks() * uint64(st.Region.BlockSize), Err: st.Err, Activation: st.Activation,
	}
	for _, r := range st.Replicas {
		s.Downstairs = append(s.Downstairs, volume.DownstairsStatus{
			Target: r.Target, State: r.State.String(), Serving: r.State == engine.ReplicaActive,
			LastError: r.LastError, FaultReason: r.FaultReason, Repair: r.Repair,
		})
	}
	return s
}
