package sim

import (
	"fmt"
	"io"
	"runtime"
	"sync"
)

// CampaignReport sums the runs of a campaign.
type CampaignReport struct {
	First, Runs int
	Events      int
	Faults      FaultCounts
	Violations  int
	Lost        int
	Latent      int
	// WritesAcked and FlushesAcked sum the runs' acknowledged writes and
	// flushes (each run must have some).
	WritesAcked, FlushesAcked int
	// Failing lists the failing seeds with their first violation, in
	// seed order.
	Failing []Result
}

// Campaign runs seeds [first, first+n) with DefaultConfig, on up to
// workers goroutines (0: GOMAXPROCS); each run is deterministic whatever
// the parallelism. progress, if set, is called after each run.
func Campaign(first uint64, n, workers int, progress func(done int, r Result)) CampaignReport {
	return CampaignWith(DefaultProbabilities(), first, n, workers, progress)
}

// CampaignWith is Campaign with the fault chances faults (such as
// WholeVolumeCrashProbabilities).
func CampaignWith(faults Probabilities, first uint64, n, workers int, progress func(done int, r Result)) CampaignReport {
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	results := make([]Result, n)
	var (
		mu   sync.Mutex
		next int
		done int
		wg   sync.WaitGroup
	)
	for range min(workers, n) {
		wg.Go(func() {
			for {
				mu.Lock()
				i := next
				next++
				mu.Unlock()
				if i >= n {
					return
				}
				cfg := DefaultConfig(first + uint64(i))
				cfg.Faults = faults
				r := Run(cfg)
				mu.Lock()
				results[i] = r
				done++
				if progress != nil {
					progress(done, r)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	rep := CampaignReport{First: int(first), Runs: n}
	for _, r := range results {
		rep.Events += r.Events
		rep.Faults.Add(r.Faults)
		rep.Violations += len(r.Violations)
		rep.Lost += r.Lost
		rep.Latent += r.Latent
		rep.WritesAcked += r.WritesAcked
		rep.FlushesAcked += r.FlushesAcked
		if len(r.Violations) > 0 {
			rep.Failing = append(rep.Failing, r)
		}
	}
	return rep
}

// WriteTable prints the report.
func (c CampaignReport) WriteTable(w io.Writer) {
	fmt.Fprintf(w, "simulation campaign: seeds %d..%d\n", c.First, c.First+c.Runs-1)
	fmt.Fprintf(w, "  %-22s %d\n", "runs", c.Runs)
	fmt.Fprintf(w, "  %-22s %d\n", "events", c.Events)
	fmt.Fprintf(w, "  %-22s %d\n", "writes acknowledged", c.WritesAcked)
	fmt.Fprintf(w, "  %-22s %d\n", "flushes acknowledged", c.FlushesAcked)
	fmt.Fprintf(w, "  %-22s %d\n", "faults injected", c.Faults.Total())
	c.Faults.Each(func(kind string, n int) {
		fmt.Fprintf(w, "    %-20s %d\n", kind, n)
	})
	fmt.Fprintf(w, "  %-22s %d\n", "violations", c.Violations)
	fmt.Fprintf(w, "  %-22s %d\n", "lost (flushed blocks)", c.Lost)
	fmt.Fprintf(w, "  %-22s %d\n", "latent bit flips", c.Latent)
	for _, r := range c.Failing {
		fmt.Fprintf(w, "  FAIL seed %d: %s\n", r.Seed, r.Violations[0])
		fmt.Fprintf(w, "    replay: go test ./volume/sim -run TestSimulation -v -seed %d\n", r.Seed)
	}
}
