package reconcile

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"time"
)

// Errors returned by Tracker.SetPhase; test with errors.Is.
var (
	// ErrPhaseOrder means a phase change would move backwards, names an
	// unknown phase, or names a terminal phase (use Finish or Fail).
	ErrPhaseOrder = errors.New("phase change out of order")
	// ErrFinished means the run has already ended.
	ErrFinished = errors.New("progress run already finished")
)

// Tracker publishes the progress of one repair run. The driver updates it
// (from any number of goroutines) and any number of readers pull Status or
// watch Subscribe. It never blocks the driver on a reader.
//
// A run starts when the Tracker is made, in PhaseNegotiating, and ends at
// the first Finish or Fail; later updates are ignored, so the final value
// cannot be overwritten. A new run (another activation, a retried live
// repair) gets a new Tracker.
type Tracker struct {
	// clock is immutable after construction.
	clock func() time.Time

	mu sync.Mutex
	// p is the current snapshot.
	p Progress
	// workStartedAt is when the run first entered PhaseRepairing or
	// PhaseLiveRepair: the origin of the copy rate. Zero until then.
	workStartedAt time.Time
	// err is the failure given to Fail.
	err error
	// subs holds the live subscriptions' channels.
	subs map[*subscription]struct{}
}

// subscription is one Subscribe channel; ch is written and closed only
// with Tracker.mu held.
type subscription struct {
	ch chan Progress
}

// NewTracker starts a run in PhaseNegotiating at clock(). A nil clock
// means time.Now; tests pass a fake one (or run in a synctest bubble).
func NewTracker(clock func() time.Time) *Tracker {
	if clock == nil {
		clock = time.Now
	}
	now := clock()
	return &Tracker{
		clock: clock,
		p:     Progress{Phase: PhaseNegotiating, StartedAt: now, UpdatedAt: now},
		subs:  make(map[*subscription]struct{}),
	}
}

// Status returns the current snapshot.
func (t *Tracker) Status() Progress {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.p
}

// Err returns the error the run failed with, or nil.
func (t *Tracker) Err() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.err
}

// SetPhase moves the run forward to phase p. Setting the current phase
// again is a no-op. Moving backwards, to an unknown phase or to a terminal
// one returns ErrPhaseOrder; after the run ended, ErrFinished.
func (t *Tracker) SetPhase(p Phase) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	cur := t.p.Phase
	switch {
	case cur.Terminal():
		return fmt.Errorf("setting phase %q: %w", p, ErrFinished)
	case p == cur:
		return nil
	case p.Terminal() || p.rank() < cur.rank():
		return fmt.Errorf("setting phase %q after %q: %w", p, cur, ErrPhaseOrder)
	}
	t.p.Phase = p
	if (p == PhaseRepairing || p == PhaseLiveRepair) && t.workStartedAt.IsZero() {
		t.workStartedAt = t.clock()
	}
	t.publishLocked()
	return nil
}

// GrowTotals adds to the run's totals: extents to repair and bytes to
// copy newly found. Totals never shrink, so pass work as it is discovered
// rather than an upper bound.
func (t *Tracker) GrowTotals(extents, bytes uint64) {
	t.update(func(p *Progress) {
		p.ExtentsTotal = addSat(p.ExtentsTotal, extents)
		p.BytesTotal = addSat(p.BytesTotal, bytes)
	})
}

// AddCompared counts n more block hashes compared.
func (t *Tracker) AddCompared(n uint64) {
	t.update(func(p *Progress) { p.BlocksCompared = addSat(p.BlocksCompared, n) })
}

// AddBytes counts n more bytes copied. Should the count pass BytesTotal,
// the total grows with it.
func (t *Tracker) AddBytes(n uint64) {
	t.update(func(p *Progress) {
		p.BytesDone = addSat(p.BytesDone, n)
		p.BytesTotal = max(p.BytesTotal, p.BytesDone)
	})
}

// ExtentDone counts one more extent repaired. Should the count pass
// ExtentsTotal, the total grows with it.
func (t *Tracker) ExtentDone() {
	t.update(func(p *Progress) {
		p.ExtentsDone = addSat(p.ExtentsDone, 1)
		p.ExtentsTotal = max(p.ExtentsTotal, p.ExtentsDone)
	})
}

// Finish ends the run in PhaseDone. A finished repair is complete by
// definition, so the done counters are raised to their totals: the final
// value always reads 100%. Every subscriber receives it, then its channel
// is closed.
func (t *Tracker) Finish() {
	t.end(PhaseDone, nil)
}

// Fail ends the run in PhaseError with err, which Err then returns.
// Counters keep their values. Every subscriber receives the final value,
// then its channel is closed.
func (t *Tracker) Fail(err error) {
	t.end(PhaseError, err)
}

// Subscribe returns a channel of snapshots, starting with the current one,
// and a cancel function that stops and closes it (safe to call more than
// once, and after the run ended).
//
// The channel holds up to buffer snapshots (at least one). Publishing
// never waits for a subscriber: when the channel is full the oldest
// snapshot is dropped for the newest, so a slow reader skips
// intermediate values but always gets the latest. The final snapshot
// (PhaseDone or PhaseError) is the last one sent; the channel is closed
// right after it, so ranging over the channel ends on the final value.
func (t *Tracker) Subscribe(buffer int) (<-chan Progress, func()) {
	s := &subscription{ch: make(chan Progress, max(buffer, 1))}
	t.mu.Lock()
	defer t.mu.Unlock()
	s.ch <- t.p // room: the channel is new and holds at least one
	if t.p.Phase.Terminal() {
		close(s.ch)
		return s.ch, func() {}
	}
	t.subs[s] = struct{}{}
	cancel := func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		if _, ok := t.subs[s]; ok {
			delete(t.subs, s)
			close(s.ch)
		}
	}
	return s.ch, cancel
}

// update applies f to the snapshot, restamps it and publishes it, unless
// the run has ended.
func (t *Tracker) update(f func(*Progress)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.p.Phase.Terminal() {
		return
	}
	f(&t.p)
	t.publishLocked()
}

// end moves the run to the terminal phase, publishes the final value and
// closes every subscription. Only the first call has any effect.
func (t *Tracker) end(phase Phase, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.p.Phase.Terminal() {
		return
	}
	t.p.Phase = phase
	t.err = err
	if phase == PhaseDone {
		t.p.ExtentsDone = t.p.ExtentsTotal
		t.p.BytesDone = t.p.BytesTotal
	}
	t.publishLocked()
	for s := range t.subs {
		close(s.ch)
		delete(t.subs, s)
	}
}

// publishLocked restamps the snapshot with the clock, recomputes rate and
// ETA, and offers it to every subscriber without blocking.
func (t *Tracker) publishLocked() {
	now := t.clock()
	if now.After(t.p.UpdatedAt) {
		t.p.UpdatedAt = now
	}
	t.p.BytesPerSec, t.p.EtaSeconds = t.estimateLocked()
	for s := range t.subs {
		offer(s.ch, t.p)
	}
}

// estimateLocked returns the copy rate and the ETA at UpdatedAt. The rate
// is the average since copying began. The ETA is the larger of two
// estimates, each used when available: bytes left at that rate, and
// extents left at the average time per extent so far. Taking the larger
// keeps the ETA honest while BytesTotal is still growing (blocks are
// compared extent by extent) and while extents differ in size.
func (t *Tracker) estimateLocked() (bytesPerSec, etaSeconds float64) {
	p := &t.p
	origin := t.workStartedAt
	if origin.IsZero() {
		origin = p.StartedAt
	}
	elapsed := p.UpdatedAt.Sub(origin).Seconds()
	if elapsed <= 0 {
		return 0, 0
	}
	bytesPerSec = float64(p.BytesDone) / elapsed
	if p.Phase.Terminal() {
		return bytesPerSec, 0
	}
	if bytesPerSec > 0 {
		etaSeconds = float64(p.BytesTotal-p.BytesDone) / bytesPerSec
	}
	if p.ExtentsDone > 0 {
		perExtent := elapsed / float64(p.ExtentsDone)
		etaSeconds = math.Max(etaSeconds, perExtent*float64(p.ExtentsTotal-p.ExtentsDone))
	}
	return bytesPerSec, etaSeconds
}

// offer puts v on ch without blocking, dropping the oldest queued value
// when ch is full. The caller must be ch's only sender (Tracker.mu held),
// so after one receive there is room; a reader receiving concurrently
// only makes more.
func offer(ch chan Progress, v Progress) {
	select {
	case ch <- v:
		return
	default:
	}
	select {
	case <-ch:
	default:
	}
	ch <- v
}

// addSat returns a+b, saturating at the largest uint64 so a counter never
// wraps around and goes backwards.
func addSat(a, b uint64) uint64 {
	if s := a + b; s >= a {
		return s
	}
	return math.MaxUint64
}
