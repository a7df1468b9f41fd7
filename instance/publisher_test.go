package instance

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"tern/instance/apiv1"
)

func setState(s apiv1.State) func(*apiv1.View) {
	return func(snap *apiv1.View) { snap.State = s }
}

func mustPublish(t *testing.T, p *Publisher, update func(*apiv1.View)) apiv1.View {
	t.Helper()
	snap, err := p.Publish(update)
	if err != nil {
		t.Fatalf("Publish: %v", err)
	}
	return snap
}

type waitResult struct {
	snap apiv1.View
	err  error
}

// startWaiter calls WaitAfter on its own goroutine and delivers the result.
func startWaiter(ctx context.Context, p *Publisher, gen apiv1.ViewGen) <-chan waitResult {
	ch := make(chan waitResult, 1)
	go func() {
		snap, err := p.WaitAfter(ctx, gen)
		ch <- waitResult{snap, err}
	}()
	return ch
}

func TestFirstSnapshotIsGenOneAndEachPublishAddsOne(t *testing.T) {
	p := NewPublisher(apiv1.Creating, apiv1.Migration{})
	if got := p.Current(); got != (apiv1.View{Gen: 1, State: apiv1.Creating}) {
		t.Fatalf("first snapshot = %+v", got)
	}
	for i, s := range []apiv1.State{apiv1.Starting, apiv1.Running, apiv1.Rebooting, apiv1.Running} {
		snap := mustPublish(t, p, func(snap *apiv1.View) {
			snap.State = s
			snap.Gen = 1000 // must be overwritten
		})
		if want := apiv1.ViewGen(i + 2); snap.Gen != want || snap.State != s || p.Current() != snap {
			t.Fatalf("publish %d: %+v, current %+v; want gen %d state %s", i, snap, p.Current(), want, s)
		}
	}
}

func TestWaitAfterOldGenReturnsLatestAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := NewPublisher(apiv1.Creating, apiv1.Migration{})
		mustPublish(t, p, setState(apiv1.Starting))
		mustPublish(t, p, setState(apiv1.Running))
		start := time.Now()
		for _, gen := range []apiv1.ViewGen{0, 1, 2} {
			snap, err := p.WaitAfter(t.Context(), gen)
			if err != nil || snap.Gen != 3 || snap.State != apiv1.Running {
				t.Fatalf("WaitAfter(%d) = %+v, %v; want gen 3 running", gen, snap, err)
			}
		}
		if d := time.Since(start); d != 0 {
			t.Fatalf("WaitAfter on an old gen took %v of fake time; want none", d)
		}
	})
}

func TestOnePublishWakesEveryWaiter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := NewPublisher(apiv1.Creating, apiv1.Migration{})
		const waiters = 100
		var results []<-chan waitResult
		for range waiters {
			results = append(results, startWaiter(t.Context(), p, 1))
		}
		synctest.Wait() // every waiter is blocked on the channel
		for i, ch := range results {
			select {
			case r := <-ch:
				t.Fatalf("waiter %d returned before any publish: %+v", i, r)
			default:
			}
		}
		mustPublish(t, p, setState(apiv1.Starting))
		synctest.Wait()
		for i, ch := range results {
			select {
			case r := <-ch:
				if r.err != nil || r.snap.Gen != 2 || r.snap.State != apiv1.Starting {
					t.Fatalf("waiter %d: %+v, %v", i, r.snap, r.err)
				}
			default:
				t.Fatalf("waiter %d still blocked after the publish", i)
			}
		}
	})
}

func TestWaiterForAFutureGenWaitsForEnoughPublishes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := NewPublisher(apiv1.Creating, apiv1.Migration{})
		ch := startWaiter(t.Context(), p, 3)
		for _, s := range []apiv1.State{apiv1.Starting, apiv1.Running} {
			mustPublish(t, p, setState(s))
			synctest.Wait()
			select {
			case r := <-ch:
				t.Fatalf("returned at gen %d: %+v, %v", p.Current().Gen, r.snap, r.err)
			default:
			}
		}
		mustPublish(t, p, setState(apiv1.Rebooting))
		if r := <-ch; r.err != nil || r.snap.Gen != 4 {
			t.Fatalf("got %+v, %v; want gen 4", r.snap, r.err)
		}
	})
}

func TestWaiterReturnsContextErrorWhenCancelledOrTimedOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := NewPublisher(apiv1.Running, apiv1.Migration{})

		ctx, cancel := context.WithCancel(t.Context())
		ch := startWaiter(ctx, p, 1)
		synctest.Wait()
		cancel()
		if r := <-ch; !errors.Is(r.err, context.Canceled) {
			t.Fatalf("cancelled waiter: %+v, %v; want context.Canceled", r.snap, r.err)
		}

		ctx, cancel = context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		start := time.Now()
		snap, err := p.WaitAfter(ctx, 1)
		if !errors.Is(err, context.DeadlineExceeded) || snap != (apiv1.View{}) {
			t.Fatalf("timed-out waiter: %+v, %v; want DeadlineExceeded", snap, err)
		}
		if d := time.Since(start); d != 30*time.Second {
			t.Fatalf("timed out after %v; want 30s", d)
		}

		// A cancelled context does not hide a snapshot that is already there.
		ctx, cancel = context.WithCancel(t.Context())
		cancel()
		if snap, err := p.WaitAfter(ctx, 0); err != nil || snap.Gen != 1 {
			t.Fatalf("WaitAfter(cancelled, 0) = %+v, %v; want gen 1", snap, err)
		}
	})
}

func TestCloseWakesEveryWaiterWithErrGone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := NewPublisher(apiv1.Running, apiv1.Migration{})
		mustPublish(t, p, setState(apiv1.Stopping))
		var results []<-chan waitResult
		for range 10 {
			results = append(results, startWaiter(t.Context(), p, 2))
		}
		synctest.Wait()
		final := mustPublish(t, p, setState(apiv1.Destroyed))
		// Every waiter sees destroyed before the instance is gone.
		for i, ch := range results {
			if r := <-ch; r.err != nil || r.snap != final {
				t.Fatalf("waiter %d: %+v, %v; want %+v", i, r.snap, r.err, final)
			}
			results[i] = startWaiter(t.Context(), p, final.Gen)
		}
		synctest.Wait()
		p.Close()
		p.Close() // idempotent
		for i, ch := range results {
			if r := <-ch; !errors.Is(r.err, ErrGone) {
				t.Fatalf("waiter %d after Close: %+v, %v; want ErrGone", i, r.snap, r.err)
			}
		}
		// A watcher that is behind still gets the final snapshot; one that is
		// caught up gets ErrGone at once.
		if snap, err := p.WaitAfter(t.Context(), 1); err != nil || snap != final {
			t.Fatalf("WaitAfter(1) after Close = %+v, %v; want %+v", snap, err, final)
		}
		if _, err := p.WaitAfter(t.Context(), final.Gen); !errors.Is(err, ErrGone) {
			t.Fatalf("WaitAfter(%d) after Close = %v; want ErrGone", final.Gen, err)
		}
		if _, err := p.Publish(setState(apiv1.Running)); !errors.Is(err, ErrGone) {
			t.Fatalf("Publish after Close = %v; want ErrGone", err)
		}
		if p.Current() != final {
			t.Fatalf("Current after Close = %+v; want %+v", p.Current(), final)
		}
	})
}

func TestGensStrictlyIncreaseUnderConcurrentPublishers(t *testing.T) {
	p := NewPublisher(apiv1.Running, apiv1.Migration{})
	const publishers, each = 8, 500
	total := apiv1.ViewGen(publishers * each)

	// A watcher follows the monitor the way the API's clients will.
	watched := make(chan []apiv1.ViewGen, 1)
	go func() {
		var gens []apiv1.ViewGen
		for gen := apiv1.ViewGen(1); gen < 1+total; {
			snap, err := p.WaitAfter(context.Background(), gen)
			if err != nil {
				break
			}
			gens = append(gens, snap.Gen)
			gen = snap.Gen
		}
		watched <- gens
	}()

	var mu sync.Mutex
	seen := map[apiv1.ViewGen]bool{}
	var wg sync.WaitGroup
	for range publishers {
		wg.Go(func() {
			last := apiv1.ViewGen(0)
			for range each {
				snap, err := p.Publish(func(s *apiv1.View) {
					// Tag the snapshot with its own (future) gen so a torn
					// or reordered publish would show.
					s.Migration.Out = apiv1.Progress{ID: "m", Phase: apiv1.Phase(1 + s.Gen%7)}
				})
				if err != nil {
					t.Error(err)
					return
				}
				if snap.Gen <= last {
					t.Errorf("gen went from %d to %d on one publisher", last, snap.Gen)
				}
				if want := apiv1.Phase(1 + (snap.Gen-1)%7); snap.Migration.Out.Phase != want {
					t.Errorf("gen %d carries phase %s; want %s", snap.Gen, snap.Migration.Out.Phase, want)
				}
				last = snap.Gen
				mu.Lock()
				seen[snap.Gen] = true
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if got := p.Current().Gen; got != 1+total {
		t.Fatalf("final gen %d; want %d", got, 1+total)
	}
	for g := apiv1.ViewGen(2); g <= 1+total; g++ {
		if !seen[g] {
			t.Fatalf("gen %d was never returned by Publish", g)
		}
	}
	gens := <-watched
	for i := 1; i < len(gens); i++ {
		if gens[i] <= gens[i-1] {
			t.Fatalf("watcher saw gen %d after %d", gens[i], gens[i-1])
		}
	}
	if len(gens) == 0 || gens[len(gens)-1] != 1+total {
		t.Fatalf("watcher ended at %v; want the final gen %d", gens[len(gens)-1:], 1+total)
	}
}

// Seed 001: a failed migration must not be reported before the source has
// resumed. The source publishes out.phase=error and state=running in one
// generation, so no watcher can see the error while the instance still
// reads as migrating, nor running while the migration still reads as live.
func TestMigrationErrorAndRunningArePublishedInOneSnapshot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := NewPublisher(apiv1.Running, apiv1.Migration{})
		var seen []apiv1.View
		done := make(chan struct{})
		go func() {
			defer close(done)
			for gen := apiv1.ViewGen(0); ; {
				snap, err := p.WaitAfter(t.Context(), gen)
				if err != nil {
					return
				}
				seen = append(seen, snap)
				gen = snap.Gen
			}
		}()
		synctest.Wait()
		const id = "6f1c2a9e-0000-4000-8000-000000000001"
		mustPublish(t, p, func(s *apiv1.View) {
			s.State = apiv1.Migrating
			s.Migration.Out = apiv1.Progress{ID: id, Phase: apiv1.PhaseSync}
		})
		synctest.Wait()
		for _, ph := range []apiv1.Phase{apiv1.PhaseRAMPush, apiv1.PhasePause} {
			mustPublish(t, p, func(s *apiv1.View) { s.Migration.Out.Phase = ph })
			synctest.Wait()
		}
		failed := mustPublish(t, p, func(s *apiv1.View) {
			s.State = apiv1.Running
			s.Migration.Out.Phase = apiv1.PhaseError
		})
		synctest.Wait()
		p.Close()
		<-done

		if len(seen) != 5 {
			t.Fatalf("watcher saw %d snapshots; want 5: %+v", len(seen), seen)
		}
		if last := seen[len(seen)-1]; last != failed || last.State != apiv1.Running ||
			last.Migration.Out != (apiv1.Progress{ID: id, Phase: apiv1.PhaseError}) {
			t.Fatalf("last snapshot %+v; want running with out={%s, error}", last, id)
		}
		for _, s := range seen {
			errored := s.Migration.Out.Phase == apiv1.PhaseError
			if errored != (s.State == apiv1.Running && s.Migration.Out.Active()) {
				t.Fatalf("snapshot %+v shows half of the failure", s)
			}
		}
		// A new migration may start as soon as that generation is visible.
		if d, _ := Decide(failed.State, PendingOf(apiv1.MigrateOut).Completed(apiv1.MigrateOut), apiv1.MigrateOut); d.Disposition != Enqueue {
			t.Fatalf("migrate_out after the failure is visible: %s", d)
		}
	})
}

func TestPublishedSnapshotsShareNothing(t *testing.T) {
	p := NewPublisher(apiv1.Migrating, apiv1.Migration{In: apiv1.Progress{ID: "a", Phase: apiv1.PhaseSync}})
	first := p.Current()
	mustPublish(t, p, func(s *apiv1.View) { s.Migration.In.Phase = apiv1.PhaseRAMPush })
	if first.Migration.In.Phase != apiv1.PhaseSync {
		t.Fatalf("an earlier snapshot changed: %+v", first)
	}
}

func TestSnapshotJSONHasExactlyTheAPIKeys(t *testing.T) {
	for _, tc := range []struct {
		snap apiv1.View
		want string
	}{
		{
			apiv1.View{Gen: 1, State: apiv1.Creating},
			`{"gen":1,"state":"creating","migration":{"in":null,"out":null}}`,
		},
		{
			apiv1.View{Gen: 7, State: apiv1.Running, Migration: apiv1.Migration{Out: apiv1.Progress{ID: "m1", Phase: apiv1.PhaseError, Round: 2, BytesSent: 4096, Error: "peer: gone"}}},
			`{"gen":7,"state":"running","migration":{"in":null,"out":{"id":"m1","phase":"error","round":2,"bytes_sent":4096,` +
				`"pages_remaining":0,"dirty_pages_per_sec":0,"bandwidth_bytes_per_sec":0,"estimated_downtime_ms":0,"error":"peer: gone"}}}`,
		},
		{
			apiv1.View{Gen: 2, State: apiv1.Migrating, Migration: apiv1.Migration{In: apiv1.Progress{ID: "m2", Phase: apiv1.PhaseRAMPushDirty}}},
			`{"gen":2,"state":"migrating","migration":{"in":{"id":"m2","phase":"ram_push_dirty","round":0,"bytes_sent":0,` +
				`"pages_remaining":0,"dirty_pages_per_sec":0,"bandwidth_bytes_per_sec":0,"estimated_downtime_ms":0},"out":null}}`,
		},
		{
			apiv1.View{Gen: 9, State: apiv1.Destroyed, Migration: apiv1.Migration{Out: apiv1.Progress{ID: "m3", Phase: apiv1.PhaseFinish, Round: 3,
				BytesSent: 8192, PagesRemaining: 0, DirtyPagesPerSec: 12.5, BandwidthBytesPerSec: 1e8, EstimatedDowntimeMs: 1.5, TotalMs: 900, DowntimeMs: 12}}},
			`{"gen":9,"state":"destroyed","migration":{"in":null,"out":{"id":"m3","phase":"finish","round":3,"bytes_sent":8192,` +
				`"pages_remaining":0,"dirty_pages_per_sec":12.5,"bandwidth_bytes_per_sec":100000000,"estimated_downtime_ms":1.5,"total_ms":900,"downtime_ms":12}}}`,
		},
	} {
		b, err := json.Marshal(tc.snap)
		if err != nil {
			t.Fatal(err)
		}
		if string(b) != tc.want {
			t.Errorf("Marshal(%+v) = %s; want %s", tc.snap, b, tc.want)
		}
		var back apiv1.View
		if err := json.Unmarshal(b, &back); err != nil || back != tc.snap {
			t.Errorf("round trip of %s = %+v, %v", b, back, err)
		}
	}
	if _, err := json.Marshal(apiv1.View{Gen: 1}); err == nil {
		t.Error("a snapshot with no state marshaled")
	}
	var s apiv1.View
	if err := json.Unmarshal([]byte(`{"gen":1,"state":"running","migration":{"in":{"id":"x","phase":"warp"},"out":null}}`), &s); err == nil {
		t.Error("an unknown phase parsed")
	}
}

func TestPublisherAtStartsPastAnEarlierInstance(t *testing.T) {
	p := NewPublisherAt(7, apiv1.Creating, apiv1.Migration{})
	if got := p.Current(); got.Gen != 7 || got.State != apiv1.Creating {
		t.Fatalf("first snapshot = %+v; want gen 7 creating", got)
	}
	if snap := mustPublish(t, p, setState(apiv1.Starting)); snap.Gen != 8 {
		t.Fatalf("next gen = %d; want 8", snap.Gen)
	}
	if got := NewPublisherAt(0, apiv1.Creating, apiv1.Migration{}).Current().Gen; got != 1 {
		t.Fatalf("NewPublisherAt(0) gen = %d; want 1", got)
	}
}
