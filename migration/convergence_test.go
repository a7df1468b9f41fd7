package migration

import (
	"math"
	"math/big"
	"testing"
	"time"
)

// fitsTarget is the convergence condition in exact integer arithmetic:
// dirty / bw ≤ target  ⇔  dirty·1e9 ≤ target_ns·bw.
func fitsTarget(dirty uint64, bw uint64, target time.Duration) bool {
	if bw == 0 {
		return false
	}
	lhs := new(big.Int).Mul(new(big.Int).SetUint64(dirty), big.NewInt(int64(time.Second)))
	rhs := new(big.Int).Mul(big.NewInt(int64(target)), new(big.Int).SetUint64(bw))
	return lhs.Cmp(rhs) <= 0
}

func TestDecideExhaustively(t *testing.T) {
	dirties := []uint64{0, 1, 4095, 4096, 1 << 20, 3 << 20, 30 << 20, 1 << 30, 1 << 40, math.MaxUint64}
	bws := []uint64{0, 1, 1 << 20, 100 << 20, 1 << 30, 10 << 30}
	targets := []time.Duration{0, time.Nanosecond, time.Millisecond, 30 * time.Millisecond, time.Second}
	limits := []int{0, 1, 2, 5, 10}
	n := 0
	for _, dirty := range dirties {
		for _, bw := range bws {
			for _, target := range targets {
				for _, limit := range limits {
					for rounds := 0; rounds <= 12; rounds++ {
						n++
						p := Policy{DowntimeTarget: target, MaxRounds: limit}
						got := Decide(p, Observation{RoundsDone: rounds, DirtyBytes: dirty, BandwidthBytesPerSec: float64(bw)})
						eff := p.withDefaults()
						// Rounding of the float path may only matter within a
						// nanosecond of the boundary; the grid stays off it
						// except where both sides agree.
						fits := fitsTarget(dirty, bw, eff.DowntimeTarget)
						var want Reason
						switch {
						case dirty == 0:
							want = ReasonClean
						case fits:
							want = ReasonConverged
						case rounds >= eff.MaxRounds:
							want = ReasonRoundLimit
						default:
							want = ReasonIterate
						}
						if got.Reason != want || got.Pause != (want != ReasonIterate) {
							t.Fatalf("Decide(%+v, dirty %d bw %d rounds %d) = %+v; want %v", p, dirty, bw, rounds, got, want)
						}
						if dirty == 0 && got.EstimatedDowntime != 0 {
							t.Fatalf("clean guest estimated %v", got.EstimatedDowntime)
						}
						if got.EstimatedDowntime < 0 {
							t.Fatalf("negative estimate %v", got.EstimatedDowntime)
						}
					}
				}
			}
		}
	}
	t.Logf("%d cases", n)
}

func TestDecideDefaults(t *testing.T) {
	// 3 MiB at 100 MiB/s is 30 ms: exactly the default target.
	d := Decide(Policy{}, Observation{RoundsDone: 1, DirtyBytes: 3 << 20, BandwidthBytesPerSec: 100 << 20})
	if !d.Pause || d.Reason != ReasonConverged || d.EstimatedDowntime != 30*time.Millisecond {
		t.Fatalf("got %+v", d)
	}
	d = Decide(Policy{}, Observation{RoundsDone: DefaultMaxRounds - 1, DirtyBytes: 4 << 20, BandwidthBytesPerSec: 100 << 20})
	if d.Pause {
		t.Fatalf("paused early: %+v", d)
	}
	d = Decide(Policy{}, Observation{RoundsDone: DefaultMaxRounds, DirtyBytes: 4 << 20, BandwidthBytesPerSec: 100 << 20})
	if !d.Pause || d.Reason != ReasonRoundLimit {
		t.Fatalf("no round limit: %+v", d)
	}
}

func TestEstimateDowntimeIsMonotoneInDirtyBytes(t *testing.T) {
	for _, bw := range []float64{1, 1e6, 1e9} {
		prev := time.Duration(0)
		for d := uint64(0); d < 1<<40; d = d*3 + 1 {
			e := EstimateDowntime(d, bw)
			if e < prev {
				t.Fatalf("bw %v: estimate for %d is %v < %v", bw, d, e, prev)
			}
			prev = e
		}
	}
}
