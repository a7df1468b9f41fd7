package chaos

import (
	"context"
	"flag"
	"os"
	"runtime"
	"testing"
	"time"

	"tern/internal/testwait"
)

// soakDuration is how long TestSoak runs: -duration, else 2 minutes in
// CI (CI=true) and 20 s elsewhere, so `go test ./...` stays quick on a
// laptop; `tern bench soak` is the long run (30 minutes by default).
var soakDuration = flag.Duration("duration", 0, "soak: how long TestSoak runs (default 2m with CI=true, else 20s)")

// DefaultSoakDuration is what TestSoak runs for without -duration.
func defaultSoakDuration() time.Duration {
	if *soakDuration > 0 {
		return *soakDuration
	}
	if os.Getenv("CI") == "true" {
		return 2 * time.Minute
	}
	return 20 * time.Second
}

// TestSoakResourcesStayBounded loops start/IO/kill/restart/verify/close
// on real downstairs processes and samples goroutines, fds, UDP sockets
// (one per QUIC connection) and RSS every 2 s: none may keep growing, and
// the goroutines return to where they were once the loop ends.
func TestSoakResourcesStayBounded(t *testing.T) {
	d := defaultSoakDuration()
	if dl, ok := t.Deadline(); ok && time.Until(dl) < d+2*time.Minute {
		t.Fatalf("-duration %v does not fit in the test's -timeout (%v left); raise -timeout", d, time.Until(dl).Round(time.Second))
	}
	before := runtime.NumGoroutine()
	c, err := NewCluster(ternBinary(t), t.TempDir(), testRegion)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.StopAll() })
	spec := SoakSpec{Duration: d, SampleEvery: 2 * time.Second, Seed: 5, RecoverTimeout: 2 * time.Minute}
	ctx, cancel := context.WithTimeout(context.Background(), d+5*time.Minute)
	defer cancel()
	res, err := RunSoak(ctx, c, spec, t.Logf)
	t.Logf("soak %v: %d iterations, %d kills, %d restarts, %d writes acknowledged, %d reads verified; %d violations, %d lost; %d samples",
		d, res.Iterations, res.Kills, res.Restarts, res.Workload.WritesAcked, res.Workload.ReadsVerified, res.Violations, res.Lost, len(res.Samples))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Samples) < 3 {
		t.Errorf("%d samples, want at least 3", len(res.Samples))
	}
	if res.Violations != 0 || res.Lost != 0 {
		t.Errorf("%d violations, %d lost", res.Violations, res.Lost)
	}
	for _, f := range Figures {
		tr := TrendOf(res.Samples, f.Value)
		t.Logf("%-18s first %8.1f last %8.1f slope %+8.2f/min; peak first third %8.1f, last third %8.1f",
			f.Name, tr.First, tr.Last, tr.PerMinute, tr.FirstThirdMax, tr.LastThirdMax)
		if !tr.Bounded(f.Slack) {
			t.Errorf("%s grows: peak %.1f in the last third against %.1f in the first", f.Name, tr.LastThirdMax, tr.FirstThirdMax)
		}
	}
	testwait.For(t, time.Minute, "goroutines back to where they were", func() bool { return runtime.NumGoroutine() <= before+5 })
}

func TestTrendOfFitsTheSlopeAndTellsGrowthFromAPlateau(t *testing.T) {
	var growing, flat []Sample
	for i := range 30 {
		growing = append(growing, Sample{At: time.Duration(i) * time.Minute, Goroutines: 100 + 10*i})
		flat = append(flat, Sample{At: time.Duration(i) * time.Minute, Goroutines: 100 + i%3})
	}
	g := func(s Sample) float64 { return float64(s.Goroutines) }
	if tr := TrendOf(growing, g); tr.PerMinute < 9.99 || tr.PerMinute > 10.01 || tr.Bounded(50) {
		t.Errorf("growing: %+v", tr)
	}
	if tr := TrendOf(flat, g); !tr.Bounded(5) || tr.PerMinute > 0.1 || tr.PerMinute < -0.1 {
		t.Errorf("flat: %+v", tr)
	}
	if tr := TrendOf(nil, g); tr != (Trend{}) {
		t.Errorf("no samples: %+v", tr)
	}
}

func TestTakeSampleCountsThisProcess(t *testing.T) {
	s, err := TakeSample(time.Now(), []int{os.Getpid()})
	if err != nil {
		t.Fatal(err)
	}
	if s.Goroutines < 1 || s.FDs < 3 || s.RSSBytes <= 0 || s.DownstairsFDs != s.FDs {
		t.Fatalf("sample %+v", s)
	}
}
