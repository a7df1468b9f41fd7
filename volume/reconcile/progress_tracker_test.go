package reconcile

import (
	"encoding/json"
	"errors"
	"math/rand/v2"
	"reflect"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// fakeClock is a settable clock safe for concurrent use.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// drain reads ch until it is closed and returns everything read.
func drain(ch <-chan Progress) []Progress {
	var got []Progress
	for p := range ch {
		got = append(got, p)
	}
	return got
}

func TestProgressJSONKeysAreTheContract(t *testing.T) {
	b, err := json.Marshal(NewTracker(newFakeClock().Now).Status())
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	want := []string{"bytes_done", "bytes_per_sec", "bytes_total", "blocks_compared", "eta_seconds",
		"extents_done", "extents_total", "phase", "started_at", "updated_at"}
	slices.Sort(want)
	if !slices.Equal(keys, want) {
		t.Errorf("keys = %v; want %v", keys, want)
	}
	if m["phase"] != "negotiating" {
		t.Errorf("phase = %v; want negotiating", m["phase"])
	}
}

func TestTrackerComputesRateAndEtaFromElapsedTime(t *testing.T) {
	clk := newFakeClock()
	start := clk.Now()
	tr := NewTracker(clk.Now)
	clk.Advance(3 * time.Second) // negotiation does not count toward the rate
	if err := tr.SetPhase(PhaseRepairing); err != nil {
		t.Fatal(err)
	}
	tr.GrowTotals(4, 400)
	clk.Advance(2 * time.Second)
	tr.AddCompared(64)
	tr.AddBytes(100)
	got := tr.Status()
	want := Progress{
		Phase: PhaseRepairing, ExtentsTotal: 4, BlocksCompared: 64, BytesTotal: 400, BytesDone: 100,
		BytesPerSec: 50, EtaSeconds: 6, StartedAt: start, UpdatedAt: start.Add(5 * time.Second),
	}
	if got != want {
		t.Errorf("Status = %+v\n want %+v", got, want)
	}

	// One extent done in 4 s with 3 left: the extent estimate (12 s) is
	// larger than the byte estimate (300 B at 50 B/s = 6 s) and wins.
	clk.Advance(2 * time.Second)
	tr.AddBytes(100)
	tr.ExtentDone()
	got = tr.Status()
	if got.BytesPerSec != 50 || got.EtaSeconds != 12 {
		t.Errorf("rate %v, eta %v; want 50, 12", got.BytesPerSec, got.EtaSeconds)
	}
}

func TestTrackerRateWithRealClockInBubble(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := NewTracker(nil) // time.Now, fake inside the bubble
		if err := tr.SetPhase(PhaseLiveRepair); err != nil {
			t.Fatal(err)
		}
		tr.GrowTotals(2, 64<<20)
		time.Sleep(4 * time.Second)
		tr.AddBytes(32 << 20)
		tr.ExtentDone()
		p := tr.Status()
		if p.BytesPerSec != 8<<20 || p.EtaSeconds != 4 {
			t.Errorf("rate %v, eta %v; want 8 MiB/s, 4 s", p.BytesPerSec, p.EtaSeconds)
		}
		if got := p.UpdatedAt.Sub(p.StartedAt); got != 4*time.Second {
			t.Errorf("UpdatedAt - StartedAt = %v; want 4s", got)
		}
	})
}

func TestSubscriberThatNeverReadsStillGetsTheFinal100Percent(t *testing.T) {
	clk := newFakeClock()
	tr := NewTracker(clk.Now)
	ch, cancel := tr.Subscribe(1)
	defer cancel()
	tr.SetPhase(PhaseComparing)
	tr.GrowTotals(800, 800<<20)
	tr.SetPhase(PhaseRepairing)
	for range 799 { // Crucible #1319 stopped at 799/800
		clk.Advance(time.Millisecond)
		tr.AddCompared(16384)
		tr.AddBytes(1 << 20)
		tr.ExtentDone()
	}
	tr.AddBytes(1 << 20)
	tr.ExtentDone()
	tr.Finish()

	got := drain(ch)
	if len(got) != 1 {
		t.Fatalf("one-slot subscriber holds %d values; want only the latest", len(got))
	}
	final := got[0]
	if final.Phase != PhaseDone || final.ExtentsDone != 800 || final.ExtentsTotal != 800 ||
		final.BytesDone != 800<<20 || final.EtaSeconds != 0 {
		t.Errorf("final = %+v; want done at 800/800 with no ETA", final)
	}
	if final != tr.Status() {
		t.Errorf("final pushed %+v differs from Status %+v", final, tr.Status())
	}
}

func TestSubscriberGetsFinalErrorAndChannelCloses(t *testing.T) {
	tr := NewTracker(newFakeClock().Now)
	ch, cancel := tr.Subscribe(4)
	defer cancel()
	tr.GrowTotals(3, 300)
	tr.AddBytes(100)
	boom := errors.New("replica 2 went away")
	tr.Fail(boom)
	tr.Finish() // ignored: the run already ended

	got := drain(ch)
	last := got[len(got)-1]
	if last.Phase != PhaseError || last.BytesDone != 100 {
		t.Errorf("last = %+v; want error with counters kept", last)
	}
	if !errors.Is(tr.Err(), boom) {
		t.Errorf("Err = %v; want %v", tr.Err(), boom)
	}
}

func TestSubscribeStartsWithCurrentValueAndAfterEndGetsFinalOnly(t *testing.T) {
	tr := NewTracker(newFakeClock().Now)
	tr.GrowTotals(1, 10)
	ch, cancel := tr.Subscribe(0) // 0 means 1
	if p := <-ch; p.ExtentsTotal != 1 || p.Phase != PhaseNegotiating {
		t.Errorf("first value = %+v; want the current one", p)
	}
	cancel()
	cancel() // idempotent
	if _, ok := <-ch; ok {
		t.Error("channel open after cancel")
	}
	tr.AddBytes(5) // publishing after a cancel must not panic

	tr.Finish()
	late, cancelLate := tr.Subscribe(3)
	got := drain(late)
	cancelLate()
	if len(got) != 1 || got[0].Phase != PhaseDone || got[0].BytesDone != 10 {
		t.Errorf("late subscriber got %+v; want just the final value", got)
	}
}

func TestTrackerDoneCountersGrowTotalsAndFinishFillsThem(t *testing.T) {
	tr := NewTracker(newFakeClock().Now)
	tr.GrowTotals(1, 100)
	tr.ExtentDone()
	tr.ExtentDone()
	tr.AddBytes(150)
	p := tr.Status()
	if p.ExtentsTotal != 2 || p.ExtentsDone != 2 || p.BytesTotal != 150 || p.BytesDone != 150 {
		t.Errorf("Status = %+v; want totals grown to 2 extents, 150 bytes", p)
	}
	tr.GrowTotals(3, 50)
	tr.Finish()
	p = tr.Status()
	if p.ExtentsDone != 5 || p.BytesDone != 200 {
		t.Errorf("after Finish = %+v; want done raised to totals 5, 200", p)
	}
	tr.AddBytes(1)
	tr.GrowTotals(1, 1)
	if tr.Status() != p {
		t.Error("updates after Finish changed the final value")
	}
}

func TestTrackerSetPhaseOnlyMovesForward(t *testing.T) {
	tr := NewTracker(newFakeClock().Now)
	steps := []struct {
		phase Phase
		want  error
	}{
		{PhaseNegotiating, nil}, // same phase: no-op
		{PhaseRepairing, nil},   // skipping comparing is allowed
		{PhaseComparing, ErrPhaseOrder},
		{Phase("bogus"), ErrPhaseOrder},
		{PhaseDone, ErrPhaseOrder}, // use Finish
		{PhaseError, ErrPhaseOrder},
		{PhaseLiveRepair, nil},
		{PhaseRepairing, ErrPhaseOrder},
	}
	for _, s := range steps {
		if err := tr.SetPhase(s.phase); !errors.Is(err, s.want) {
			t.Errorf("SetPhase(%q) = %v; want %v", s.phase, err, s.want)
		}
	}
	tr.Finish()
	if err := tr.SetPhase(PhaseLiveRepair); !errors.Is(err, ErrFinished) {
		t.Errorf("SetPhase after Finish = %v; want ErrFinished", err)
	}
}

// checkStep fails unless next may follow prev within one run.
func checkStep(t *testing.T, prev, next Progress) {
	t.Helper()
	if next.Phase.rank() < prev.Phase.rank() ||
		next.ExtentsTotal < prev.ExtentsTotal || next.ExtentsDone < prev.ExtentsDone ||
		next.BlocksCompared < prev.BlocksCompared ||
		next.BytesTotal < prev.BytesTotal || next.BytesDone < prev.BytesDone ||
		next.UpdatedAt.Before(prev.UpdatedAt) || !next.StartedAt.Equal(prev.StartedAt) {
		t.Fatalf("went backwards:\n prev %+v\n next %+v", prev, next)
	}
	checkValue(t, next)
}

// checkValue fails unless p is internally consistent.
func checkValue(t *testing.T, p Progress) {
	t.Helper()
	if p.ExtentsDone > p.ExtentsTotal || p.BytesDone > p.BytesTotal ||
		p.BytesPerSec < 0 || p.EtaSeconds < 0 {
		t.Fatalf("inconsistent value %+v", p)
	}
	if _, err := json.Marshal(p); err != nil {
		t.Fatalf("value does not encode: %v", err)
	}
}

func TestTrackerIsMonotoneUnderRandomUpdates(t *testing.T) {
	phases := []Phase{PhaseNegotiating, PhaseComparing, PhaseRepairing, PhaseLiveRepair, PhaseDone, Phase("x")}
	for seed := range uint64(200) {
		rng := rand.New(rand.NewPCG(seed, 99))
		clk := newFakeClock()
		tr := NewTracker(clk.Now)
		ch, cancel := tr.Subscribe(1 + rng.IntN(3))
		prev := tr.Status()
		for range 200 {
			// The clock may even step back; UpdatedAt must not.
			clk.Advance(time.Duration(rng.IntN(2000)-200) * time.Millisecond)
			switch rng.IntN(9) {
			case 0:
				tr.SetPhase(phases[rng.IntN(len(phases))])
			case 1:
				tr.GrowTotals(uint64(rng.IntN(3)), uint64(rng.IntN(1000)))
			case 2:
				tr.AddCompared(uint64(rng.IntN(100)))
			case 3, 4:
				tr.AddBytes(uint64(rng.IntN(500)))
			case 5, 6:
				tr.ExtentDone()
			case 7:
				if rng.IntN(20) == 0 {
					tr.Finish()
				}
			default:
				if rng.IntN(20) == 0 {
					tr.Fail(errors.New("random failure"))
				}
			}
			next := tr.Status()
			checkStep(t, prev, next)
			prev = next
		}
		tr.Finish()
		got := drain(ch)
		cancel()
		for i := 1; i < len(got); i++ {
			checkStep(t, got[i-1], got[i])
		}
		if last := got[len(got)-1]; !last.Phase.Terminal() || last != tr.Status() {
			t.Fatalf("seed %d: subscriber's last value %+v is not the final %+v", seed, last, tr.Status())
		}
	}
}

func TestTrackerConcurrentPublishersAndSubscribers(t *testing.T) {
	const workers, perWorker = 4, 500
	clk := newFakeClock()
	tr := NewTracker(clk.Now)
	tr.SetPhase(PhaseRepairing)
	tr.GrowTotals(workers*perWorker, workers*perWorker*4096)

	type result struct {
		values    []Progress
		cancelled bool
	}
	results := make([]result, 6)
	var readers sync.WaitGroup
	for i := range results {
		ch, cancel := tr.Subscribe(1 + i%3)
		readers.Go(func() {
			for p := range ch {
				results[i].values = append(results[i].values, p)
				if i == 5 && len(results[i].values) == 10 {
					results[i].cancelled = true
					cancel() // a watcher that leaves early
				}
			}
			cancel()
		})
	}
	var pullers sync.WaitGroup
	stopPull := make(chan struct{})
	pullers.Go(func() {
		prev := tr.Status()
		for {
			select {
			case <-stopPull:
				return
			default:
			}
			next := tr.Status()
			checkStep(t, prev, next)
			prev = next
		}
	})

	var writers sync.WaitGroup
	for range workers {
		writers.Go(func() {
			for range perWorker {
				clk.Advance(time.Millisecond)
				tr.AddCompared(1)
				tr.AddBytes(4096)
				tr.ExtentDone()
			}
		})
	}
	writers.Wait()
	tr.Finish()
	readers.Wait()
	close(stopPull)
	pullers.Wait()

	final := tr.Status()
	if final.Phase != PhaseDone || final.ExtentsDone != workers*perWorker || final.BytesDone != workers*perWorker*4096 {
		t.Fatalf("final = %+v", final)
	}
	for i, r := range results {
		for j := 1; j < len(r.values); j++ {
			checkStep(t, r.values[j-1], r.values[j])
		}
		if r.cancelled {
			continue
		}
		if last := r.values[len(r.values)-1]; !reflect.DeepEqual(last, final) {
			t.Errorf("subscriber %d ended on %+v; want the final value", i, last)
		}
	}
}
