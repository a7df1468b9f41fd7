package bench

import (
	"context"
	"math/rand/v2"
	"slices"
	"sync"
	"time"
)

// IOShape is one workload: request size, access pattern and queue depth.
type IOShape struct {
	Name       string
	Write      bool
	Random     bool
	BlockBytes int
	QueueDepth int
}

// Result is what one load run measured.
type Result struct {
	Ops       int64
	Bytes     int64
	Elapsed   time.Duration
	Latencies []time.Duration // sorted
}

// IOPS is completed operations per second.
func (r Result) IOPS() float64 { return float64(r.Ops) / r.Elapsed.Seconds() }

// MiBPerSec is the payload throughput.
func (r Result) MiBPerSec() float64 { return float64(r.Bytes) / (1 << 20) / r.Elapsed.Seconds() }

// Percentile returns the q-quantile latency (0 < q ≤ 1).
func (r Result) Percentile(q float64) time.Duration {
	if len(r.Latencies) == 0 {
		return 0
	}
	i := int(q*float64(len(r.Latencies))+0.5) - 1
	return r.Latencies[min(max(i, 0), len(r.Latencies)-1)]
}

// opFunc performs one IO of buf at byte offset off; worker identifies the
// caller (0 ≤ worker < queue depth).
type opFunc func(ctx context.Context, worker int, buf []byte, off int64) error

// runLoad keeps shape.QueueDepth operations in flight over a space of
// spaceBytes for d, each worker with its own buffer, and measures every
// operation's latency. Sequential shapes give each worker its own stripe.
// Operations started before the deadline run to completion and count, so
// every worker completes at least one and none is cut short.
func runLoad(ctx context.Context, shape IOShape, spaceBytes int64, d time.Duration, op opFunc) (Result, error) {
	deadline := time.Now().Add(d)
	qd := shape.QueueDepth
	blocks := spaceBytes / int64(shape.BlockBytes)
	lat := make([][]time.Duration, qd)
	ops := make([]int64, qd)
	errs := make([]error, qd)
	var wg sync.WaitGroup
	start := time.Now()
	for w := range qd {
		wg.Go(func() {
			buf := make([]byte, shape.BlockBytes)
			for i := range buf {
				buf[i] = byte(w + i)
			}
			rng := rand.New(rand.NewPCG(uint64(w), 0x7e72))
			next := int64(w) * (blocks / int64(qd))
			lat[w] = make([]time.Duration, 0, 1<<16)
			for ctx.Err() == nil && (ops[w] == 0 || time.Now().Before(deadline)) {
				var blk int64
				if shape.Random {
					blk = rng.Int64N(blocks)
				} else {
					blk, next = next, (next+1)%blocks
				}
				t0 := time.Now()
				if err := op(ctx, w, buf, blk*int64(shape.BlockBytes)); err != nil {
					errs[w] = err
					return
				}
				lat[w] = append(lat[w], time.Since(t0))
				ops[w]++
			}
		})
	}
	wg.Wait()
	res := Result{Elapsed: time.Since(start)}
	for w := range qd {
		if errs[w] != nil {
			return res, errs[w]
		}
		res.Ops += ops[w]
		res.Latencies = append(res.Latencies, lat[w]...)
	}
	res.Bytes = res.Ops * int64(shape.BlockBytes)
	slices.Sort(res.Latencies)
	return res, nil
}
