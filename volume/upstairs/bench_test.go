package upstairs

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"

	"tern/volume/extent"
	"tern/volume/ids"
	"tern/volume/upstairs/engine"
	"tern/volume/wire"
)

// benchVolume is three in-process downstairs of 64 MiB (16 extents of
// 4 MiB) and an activated upstairs on them.
func benchVolume(b *testing.B) *Upstairs {
	b.Helper()
	c := newClusterSpec(b, extent.NewSpec(4096, 1024, 16))
	cfg := c.config()
	cfg.Logger = slog.New(slog.DiscardHandler)
	return c.open(cfg, 1)
}

const benchVolumeBytes = 64 << 20

func BenchmarkWriteAt(b *testing.B) {
	for _, size := range []int{4 << 10, 1 << 20} {
		for _, qd := range []int{1, 16} {
			b.Run(fmt.Sprintf("%dKiB/qd%d", size>>10, qd), func(b *testing.B) {
				benchIO(b, size, qd, func(u *Upstairs, ctx context.Context, p []byte, off int64) error {
					_, err := u.WriteAt(ctx, p, off)
					return err
				})
			})
		}
	}
}

func BenchmarkReadAt(b *testing.B) {
	for _, size := range []int{4 << 10, 1 << 20} {
		for _, qd := range []int{1, 16} {
			b.Run(fmt.Sprintf("%dKiB/qd%d", size>>10, qd), func(b *testing.B) {
				benchIO(b, size, qd, func(u *Upstairs, ctx context.Context, p []byte, off int64) error {
					_, err := u.ReadAt(ctx, p, off)
					return err
				})
			})
		}
	}
}

// benchIO runs op at queue depth qd over the volume, size bytes at a time.
func benchIO(b *testing.B, size, qd int, op func(*Upstairs, context.Context, []byte, int64) error) {
	u := benchVolume(b)
	ctx := context.Background()
	// Write everything once so reads return data and writes overwrite.
	fill := make([]byte, 1<<20)
	for off := int64(0); off < benchVolumeBytes; off += int64(len(fill)) {
		FillPattern(fill, 4096, uint64(off/4096), 1)
		if _, err := u.WriteAt(ctx, fill, off); err != nil {
			b.Fatal(err)
		}
	}
	slots := int64(benchVolumeBytes / size)
	var next atomic.Int64
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.SetParallelism(qd)
	b.ResetTimer()
	if qd == 1 {
		p := make([]byte, size)
		for i := 0; b.Loop(); i++ {
			if err := op(u, ctx, p, (int64(i)%slots)*int64(size)); err != nil {
				b.Fatal(err)
			}
		}
		return
	}
	b.RunParallel(func(pb *testing.PB) {
		p := make([]byte, size)
		for pb.Next() {
			off := (next.Add(1) % slots) * int64(size)
			if err := op(u, ctx, p, off); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkEngineWriteCycle is the decision core alone: submit a write,
// send it to three replicas, two acks, a private copy, the third ack.
func BenchmarkEngineWriteCycle(b *testing.B) {
	e := engine.New(engine.Limits{BacklogJobs: 1000, BacklogBytes: 64 << 20, InflightJobs: 2000, InflightBytes: 128 << 20})
	e.Activate([engine.ReplicaCount]bool{true, true, true}, 1)
	e.TakeActions()
	deps := make([]wire.JobID, 0, 16)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		id, err := e.SubmitWrite(ids.BlockIndex(i%1024), 1, 4096)
		if err != nil {
			b.Fatal(err)
		}
		for r := range engine.ReplicaCount {
			j, _ := e.TakeNext(r)
			deps = e.SendDeps(deps[:0], j, r)
			e.Sent(r, id)
		}
		e.Done(0, id)
		e.Done(1, id)
		e.Privatized(id, true)
		e.Done(2, id)
		e.TakeActions()
	}
}

// BenchmarkActivationRepair measures activation when one replica of a
// 256 MiB volume (64 MiB extents) is stale in 1% of its blocks,
// scattered: block-level repair against whole-extent copying.
func BenchmarkActivationRepair(b *testing.B) {
	for _, whole := range []bool{false, true} {
		name := "blocks"
		if whole {
			name = "whole_extents"
		}
		b.Run(name, func(b *testing.B) {
			spec := extent.NewSpec(testBlockSize, 16384, 4)
			total := spec.Blocks()
			var copied uint64
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				c := newClusterSpec(b, spec)
				var blocks []uint64
				for blk := uint64(0); blk < total; blk += 100 {
					blocks = append(blocks, blk)
				}
				c.ds[0].diverge(blocks, uint64(i)+2, 10, 1, false)
				c.ds[1].diverge(blocks, uint64(i)+2, 10, 1, false)
				cfg := c.config()
				cfg.Logger = nil
				cfg.RepairWholeExtents = whole
				u, err := New(cfg)
				if err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				if err := u.Activate(context.Background(), 2); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				copied = u.RepairStats().BytesCopied
				u.Close()
				for _, d := range c.ds {
					d.stop()
				}
				b.StartTimer()
			}
			b.ReportMetric(float64(copied)/(1<<20), "MiB_copied")
		})
	}
}
