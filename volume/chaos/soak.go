package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"tern/volume/ids"
)

// SoakSpec is a soak: start an upstairs, run IO, kill and restart a
// replica under it, verify, close; again and again for Duration, sampling
// resources every SampleEvery.
type SoakSpec struct {
	Duration    time.Duration
	SampleEvery time.Duration
	Seed        uint64
	// RecoverTimeout bounds each wait for IO or for the replicas.
	RecoverTimeout time.Duration
}

// SoakResult is what a soak did and saw.
type SoakResult struct {
	Iterations, Kills, Restarts int
	Workload                    WorkloadStats
	// Violations sums every iteration's bad blocks and mismatched reads.
	Violations int64
	Lost       int64
	Samples    []Sample
}

// Figures are the sampled figures by name, for reports and bounds.
var Figures = []struct {
	Name  string
	Value func(Sample) float64
	// Slack is the absolute growth Trend.Bounded tolerates.
	Slack float64
}{
	{"goroutines", func(s Sample) float64 { return float64(s.Goroutines) }, 50},
	{"fds", func(s Sample) float64 { return float64(s.FDs) }, 20},
	{"udp_sockets", func(s Sample) float64 { return float64(s.UDPSockets) }, 6},
	{"rss_mib", func(s Sample) float64 { return float64(s.RSSBytes) / (1 << 20) }, 64},
	{"downstairs_fds", func(s Sample) float64 { return float64(s.DownstairsFDs) }, 30},
	{"downstairs_rss_mib", func(s Sample) float64 { return float64(s.DownstairsRSS) / (1 << 20) }, 64},
}

// RunSoak runs spec on c (replicas not running) until spec.Duration has
// passed, then stops the replicas. An error means the loop could not go
// on; violations are in the result.
func RunSoak(ctx context.Context, c *Cluster, spec SoakSpec, logf func(string, ...any)) (res SoakResult, err error) {
	r := rand.New(rand.NewPCG(spec.Seed, spec.Seed^0x94d049bb133111eb))
	w := NewWorkload(BlockSize, c.Blocks(), spec.Seed)
	start := time.Now()
	sampler := startSampler(start, c, spec.SampleEvery)
	defer func() { res.Samples = sampler.stop() }()
	gen := ids.Generation(0)
	for time.Since(start) < spec.Duration {
		gen++
		if err = soakIteration(ctx, c, w, r, gen, spec, &res); err != nil {
			return res, fmt.Errorf("iteration %d: %w", res.Iterations, err)
		}
		res.Iterations++
		if logf != nil && res.Iterations%10 == 0 {
			logf("soak: %d iterations in %v, %d writes acknowledged", res.Iterations, time.Since(start).Round(time.Second), w.Stats().WritesAcked)
		}
	}
	res.Workload = w.Stats()
	res.Violations += res.Workload.Mismatches
	return res, c.StopAll()
}

func soakIteration(ctx context.Context, c *Cluster, w *Workload, r *rand.Rand, gen ids.Generation, spec SoakSpec, res *SoakResult) error {
	if err := c.StartAll(); err != nil {
		return err
	}
	u, err := openUpstairs(c, c.Addrs(), gen)
	if err != nil {
		return err
	}
	defer u.Close()
	lanes := w.StartLanes(ctx, u, 2, LaneSpec{MaxIOBlocks: 8, FlushEvery: 4, ReadBack: true,
		IOTimeout: spec.RecoverTimeout, Seed: spec.Seed + uint64(gen)*100})
	defer lanes.Stop()
	acked := w.Stats().WritesAcked
	if acked, err = waitMoreAcks(ctx, w, acked, 20+r.IntN(60), spec.RecoverTimeout); err != nil {
		return err
	}
	victim := c.Replicas[r.IntN(3)]
	if err := victim.Kill(); err != nil {
		return err
	}
	res.Kills++
	if _, err = waitMoreAcks(ctx, w, acked, 10+r.IntN(40), spec.RecoverTimeout); err != nil {
		return err
	}
	if err := victim.Start(); err != nil {
		return err
	}
	res.Restarts++
	if err := waitAllActive(ctx, u, spec.RecoverTimeout); err != nil {
		return err
	}
	if err := lanes.Stop(); err != nil {
		return err
	}
	vctx, cancel := context.WithTimeout(ctx, spec.RecoverTimeout)
	defer cancel()
	rep, err := w.Verify(vctx, u, 64)
	if err != nil {
		return err
	}
	res.Violations += rep.Violations()
	res.Lost += rep.Lost
	if rep.Violations() > 0 {
		return fmt.Errorf("%d bad blocks after the repair; first: %s", rep.Violations(), rep.First)
	}
	return u.Close()
}

type sampler struct {
	stopCh chan struct{}
	done   chan []Sample
}

// startSampler samples every period until stop, which returns them all.
// Only ticks sample: the moments before the first start and after the
// last stop would say nothing about the loop.
func startSampler(start time.Time, c *Cluster, period time.Duration) *sampler {
	s := &sampler{stopCh: make(chan struct{}), done: make(chan []Sample, 1)}
	go func() {
		var out []Sample
		take := func() {
			if smp, err := TakeSample(start, c.pids()); err == nil {
				out = append(out, smp)
			}
		}
		tick := time.NewTicker(period)
		defer tick.Stop()
		for {
			select {
			case <-tick.C:
				take()
			case <-s.stopCh:
				s.done <- out
				return
			}
		}
	}()
	return s
}

func (s *sampler) stop() []Sample {
	close(s.stopCh)
	return <-s.done
}

func (c *Cluster) pids() []int {
	var out []int
	for _, r := range c.Replicas {
		if pid := r.PID(); pid != 0 {
			out = append(out, pid)
		}
	}
	return out
}
