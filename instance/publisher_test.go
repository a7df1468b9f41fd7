package instance

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"tern/migration"
)

func setState(s State) func(*Snapshot) {
	return func(snap *Snapshot) { snap.State = s }
}

func mustPublish(t *testing.T, p *Publisher, update func(*Snapshot)) Snapshot {
	t.Helper()
	snap, err := p.Publish(update)
	if err != nil {
		t.Fatalf("Publish: %v", err)
	}
	return snap
}

type waitResult struct {
	snap Snapshot
	err  error
}

// startWaiter calls WaitAfter on its own goroutine and delivers the result.
func startWaiter(ctx context.Context, p *Publisher, gen uint64) <-chan waitResult {
	ch := make(chan waitResult, 1)
	go func() {
		snap, err := p.WaitAfter(ctx, gen)
		ch <- waitResult{snap, err}
	}()
	return ch
}

func TestFirstSnapshotIsGenOneAndEachPublishAddsOne(t *testing.T) {
	p := NewPublisher(Creating, Migration{})
	if got := p.Current(); got != (Snapshot{Gen: 1, State: Creating}) {
		t.Fatalf("first snapshot = %+v", got)
	}
	for i, s := range []State{Starting, Running, Rebooting, Running} {
		snap := mustPublish(t, p, func(snap *Snapshot) {
			snap.State = s
			snap.Gen = 1000 // must be overwritten
		})
		if want := uint64(i + 2); snap.Gen != want || snap.State != s || p.Current() != snap {
			t.Fatalf("publish %d: %+v, current %+v; want gen %d state %s", i, snap, p.Current(), want, s)
		}
	}
}

func TestWaitAfterOldGenReturnsLatestAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := NewPublisher(Creating, Migration{})
		mustPublish(t, p, setState(Starting))
		mustPublish(t, p, setState(Running))
		start := time.Now()
		for _, gen := range []uint64{0, 1, 2} {
			snap, err := p.WaitAfter(t.Context(), gen)
			if err != nil || snap.Gen != 3 || snap.State != Running {
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
		p := NewPublisher(Creating, Migration{})
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
		mustPublish(t, p, setState(Starting))
		synctest.Wait()
		for i, ch := range results {
			select {
			case r := <-ch:
				if r.err != nil || r.snap.Gen != 2 || r.snap.State != Starting {
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
		p := NewPublisher(Creating, Migration{})
		ch := startWaiter(t.Context(), p, 3)
		for _, s := range []State{Starting, Running} {
			mustPublish(t, p, setState(s))
			synctest.Wait()
			select {
			case r := <-ch:
				t.Fatalf("returned at gen %d: %+v, %v", p.Current().Gen, r.snap, r.err)
			default:
			}
		}
		mustPublish(t, p, setState(Rebooting))
		if r := <-ch; r.err != nil || r.snap.Gen != 4 {
			t.Fatalf("got %+v, %v; want gen 4", r.snap, r.err)
		}
	})
}

func TestWaiterReturnsContextErrorWhenCancelledOrTimedOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := NewPublisher(Running, Migration{})

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
		if !errors.Is(err, context.DeadlineExceeded) || snap != (Snapshot{}) {
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
		p := NewPublisher(Running, Migration{})
		mustPublish(t, p, setState(Stopping))
		var results []<-chan waitResult
		for range 10 {
			results = append(results, startWaiter(t.Context(), p, 2))
		}
		synctest.Wait()
		final := mustPublish(t, p, setState(Destroyed))
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
		if _, err := p.Publish(setState(Running)); !errors.Is(err, ErrGone) {
			t.Fatalf("Publish after Close = %v; want ErrGone", err)
		}
		if p.Current() != final {
			t.Fatalf("Current after Close = %+v; want %+v", p.Current(), final)
		}
	})
}

func TestGensStrictlyIncreaseUnderConcurrentPublishers(t *testing.T) {
	p := NewPublisher(Running, Migration{})
	const publishers, each = 8, 500
	total := uint64(publishers * each)

	// A watcher follows the monitor the way the API's clients will.
	watched := make(chan []uint64, 1)
	go func() {
		var gens []uint64
		for gen := uint64(1); gen < 1+total; {
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
	seen := map[uint64]bool{}
	var wg sync.WaitGroup
	for range publishers {
		wg.Go(func() {
			last := uint64(0)
			for range each {
				snap, err := p.Publish(func(s *Snapshot) {
					// Tag the snapshot with its own (future) gen so a torn
					// or reordered publish would show.
					s.Migration.Out = migration.Progress{ID: "m", Phase: migration.Phase(1 + s.Gen%7)}
				})
				if err != nil {
					t.Error(err)
					return
				}
				if snap.Gen <= last {
					t.Errorf("gen went from %d to %d on one publisher", last, snap.Gen)
				}
				if want := migration.Phase(1 + (snap.Gen-1)%7); snap.Migration.Out.Phase != want {
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
	for g := uint64(2); g <= 1+total; g++ {
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
		p := NewPublisher(Running, Migration{})
		var seen []Snapshot
		done := make(chan struct{})
		go func() {
			defer close(done)
			for gen := uint64(0); ; {
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
		mustPublish(t, p, func(s *Snapshot) {
			s.State = Migrating
			s.Migration.Out = migration.Progress{ID: id, Phase: migration.PhaseSync}
		})
		synctest.Wait()
		for _, ph := range []migration.Phase{migration.PhaseRAMPush, migration.PhasePause} {
			mustPublish(t, p, func(s *Snapshot) { s.Migration.Out.Phase = ph })
			synctest.Wait()
		}
		failed := mustPublish(t, p, func(s *Snapshot) {
			s.State = Running
			s.Migration.Out.Phase = migration.PhaseError
		})
		synctest.Wait()
		p.Close()
		<-done

		if len(seen) != 5 {
			t.Fatalf("watcher saw %d snapshots; want 5: %+v", len(seen), seen)
		}
		if last := seen[len(seen)-1]; last != failed || last.State != Running ||
			last.Migration.Out != (migration.Progress{ID: id, Phase: migration.PhaseError}) {
			t.Fatalf("last snapshot %+v; want running with out={%s, error}", last, id)
		}
		for _, s := range seen {
			errored := s.Migration.Out.Phase == migration.PhaseError
			if errored != (s.State == Running && s.Migration.Out.Active()) {
				t.Fatalf("snapshot %+v shows half of the failure", s)
			}
		}
		// A new migration may start as soon as that generation is visible.
		if d, _ := Decide(failed.State, PendingOf(MigrateOut).Completed(MigrateOut), MigrateOut); d.Disposition != Enqueue {
			t.Fatalf("migrate_out after the failure is visible: %s", d)
		}
	})
}

func TestPublishedSnapshotsShareNothing(t *testing.T) {
	p := NewPublisher(Migrating, Migration{In: migration.Progress{ID: "a", Phase: migration.PhaseSync}})
	first := p.Current()
	mustPublish(t, p, func(s *Snapshot) { s.Migration.In.Phase = migration.PhaseRAMPush })
	if first.Migration.In.Phase != migration.PhaseSync {
		t.Fatalf("an earlier snapshot changed: %+v", first)
	}
}

func TestSnapshotJSONHasExactlyTheAPIKeys(t *testing.T) {
	for _, tc := range []struct {
		snap Snapshot
		want string
	}{
		{
			Snapshot{Gen: 1, State: Creating},
			`{"gen":1,"state":"creating","migration":{"in":null,"out":null}}`,
		},
		{
			Snapshot{Gen: 7, State: Running, Migration: Migration{Out: migration.Progress{ID: "m1", Phase: migration.PhaseError, Round: 2, BytesSent: 4096, Error: "peer: gone"}}},
			`{"gen":7,"state":"running","migration":{"in":null,"out":{"id":"m1","phase":"error","round":2,"bytes_sent":4096,` +
				`"pages_remaining":0,"dirty_pages_per_sec":0,"bandwidth_bytes_per_sec":0,"estimated_downtime_ms":0,"error":"peer: gone"}}}`,
		},
		{
			Snapshot{Gen: 2, State: Migrating, Migration: Migration{In: migration.Progress{ID: "m2", Phase: migration.PhaseRAMPushDirty}}},
			`{"gen":2,"state":"migrating","migration":{"in":{"id":"m2","phase":"ram_push_dirty","round":0,"bytes_sent":0,` +
				`"pages_remaining":0,"dirty_pages_per_sec":0,"bandwidth_bytes_per_sec":0,"estimated_downtime_ms":0},"out":null}}`,
		},
		{
			Snapshot{Gen: 9, State: Destroyed, Migration: Migration{Out: migration.Progress{ID: "m3", Phase: migration.PhaseFinish, Round: 3,
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
		var back Snapshot
		if err := json.Unmarshal(b, &back); err != nil || back != tc.snap {
			t.Errorf("round trip of %s = %+v, %v", b, back, err)
		}
	}
	if _, err := json.Marshal(Snapshot{Gen: 1}); err == nil {
		t.Error("a snapshot with no state marshaled")
	}
	var s Snapshot
	if err := json.Unmarshal([]byte(`{"gen":1,"state":"running","migration":{"in":{"id":"x","phase":"warp"},"out":null}}`), &s); err == nil {
		t.Error("an unknown phase parsed")
	}
}

func TestPublisherAtStartsPastAnEarlierInstance(t *testing.T) {
	p := NewPublisherAt(7, Creating, Migration{})
	if got := p.Current(); got.Gen != 7 || got.State != Creating {
		t.Fatalf("first snapshot = %+v; want gen 7 creating", got)
	}
	if snap := mustPublish(t, p, setState(Starting)); snap.Gen != 8 {
		t.Fatalf("next gen = %d; want 8", snap.Gen)
	}
	if got := NewPublisherAt(0, Creating, Migration{}).Current().Gen; got != 1 {
		t.Fatalf("NewPublisherAt(0) gen = %d; want 1", got)
	}
}
