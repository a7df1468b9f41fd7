package ec

import (
	"context"

	"tern/volume"
)

var _ volume.Volume = (*Volume)(nil)

// Discard writes zeroes over [off, off+length) (block aligned): the wire
// has no discard yet.
func (v *Volume) Discard(ctx context.Context, off, length int64) error {
	return v.WriteZeroes(ctx, off, length)
}

// WriteZeroes writes zeroes over [off, off+length) (block aligned), as
// ordinary writes until the wire has an operation for it.
func (v *Volume) WriteZeroes(ctx context.Context, off, length int64) error {
	v.mu.Lock()
	bs, running := v.bs, v.running
	size := v.cfg.Layout.VolumeBlocks(v.stripes) * uint64(v.bs)
	v.mu.Unlock()
	if !running {
		return ErrNotActive
	}
	return volume.WriteZeroesAsWrites(ctx, v.WriteAt, bs, size, off, length)
}

// Summary is the volume's layout-neutral status: its shards as its
// downstairs, serving while active or repairing.
func (v *Volume) Summary() volume.Status {
	st := v.Status()
	s := volume.Status{
		Layout: st.Layout.String(), Active: st.Active, Gen: st.Gen, SizeBytes: st.SizeBytes,
		Err: st.Err, Activation: st.Activation,
	}
	for _, sh := range st.Shards {
		s.Downstairs = append(s.Downstairs, volume.DownstairsStatus{
			Target: sh.Target, State: sh.State, Serving: sh.State == ShardActive || sh.State == ShardRepairing,
			LastError: sh.LastError, FaultReason: sh.FaultReason, Repair: sh.Repair,
		})
	}
	return s
}
