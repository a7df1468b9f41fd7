package upstairs

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"tern/volume/ids"
	"tern/volume/reconcile"
	"tern/volume/upstairs/engine"
	"tern/volume/wire"
)

// Upstairs is a volume client replicating to three downstairs. Its IO
// methods are safe for concurrent use; buffers passed to them are used in
// place (never copied on the steady path) and are not touched after the
// call returns.
type Upstairs struct {
	// Immutable after New.
	cfg      Config
	log      *slog.Logger
	met      *ioMetrics
	rmet     *repairMetrics
	replicas [engine.ReplicaCount]*replica
	// actTracker publishes the activation's progress from New on.
	actTracker *reconcile.Tracker
	// stats counts repair work (atomics, no lock).
	stats repairCounters
	// hooks lets tests act at fixed points of a repair; set before
	// Activate, nil in production.
	hooks *repairHooks
	// ioHooks lets tests act at fixed points of the IO path; set before
	// Activate, nil in production.
	ioHooks *ioHooks
	ctx     context.Context // ends when Close starts
	cancel  context.CancelFunc
	wg      sync.WaitGroup // replica goroutines

	// mu guards everything below, including the engine and the records.
	mu    sync.Mutex
	eng   *engine.Engine
	recs  map[wire.JobID]*ioRecord
	pools pools

	started bool
	// closing: Close began; reads and writes are refused (flushes pass
	// so Close can deactivate).
	closing bool
	closed  bool
	// act is the activation in progress or done; nil before Activate.
	act *activation
	// region is the agreed geometry once activated.
	region wire.RegionInfo
	// blockSize is region.BlockSize as an int, 0 before activation.
	blockSize int
	gen       ids.Generation
	// spaceCh is closed (and replaced) when backpressure eases and
	// spaceWaiters > 0.
	spaceCh      chan struct{}
	spaceWaiters int
	// drainCh is closed (and replaced) when the engine drains and
	// drainWaiters > 0.
	drainCh      chan struct{}
	drainWaiters int
	// privatize collects actPrivatize IDs for the step that emitted them.
	privatize []wire.JobID
	// targets are the downstairs addresses, Config.Targets until
	// ReplaceReplica swaps one.
	targets [engine.ReplicaCount]string
	// stateCh is closed (and replaced) whenever a replica changes state.
	stateCh chan struct{}
	// live is each replica's live-repair bookkeeping.
	live [engine.ReplicaCount]liveRepairSlot
	// restart is the restart reconciliation's (restart_reconcile.go).
	restart restartState
}

// activation is what Activate and the replica goroutines share while the
// sessions are negotiated; guarded by Upstairs.mu.
type activation struct {
	gen ids.Generation
	// changed is closed (and replaced) whenever a replica reports.
	changed chan struct{}
	// proceed is closed when Activate has checked the regions and lets the
	// replicas send Activate.
	proceed chan struct{}
	// decided is set once Activate chose the replicas that take part.
	decided bool
	region  [engine.ReplicaCount]*wire.RegionInfo
	done    [engine.ReplicaCount]bool
	err     [engine.ReplicaCount]error
	// versions are the extent versions each replica reported.
	versions [engine.ReplicaCount][]wire.ExtentVersion
}

// New validates cfg (reporting every problem at once) and returns an
// Upstairs that connects when Activate is called.
func New(cfg Config) (*Upstairs, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("creating upstairs: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	u := &Upstairs{
		cfg:     cfg,
		log:     cfg.Logger.With("component", "upstairs", "upstairs_id", cfg.UpstairsID),
		met:     newIOMetrics(cfg.Metrics, cfg.UpstairsID),
		rmet:    newRepairMetrics(cfg.Metrics, cfg.UpstairsID),
		stateCh: make(chan struct{}),
		restart: restartState{changed: make(chan struct{})},

		actTracker: reconcile.NewTracker(nil),
		ctx:        ctx,
		cancel:     cancel,
		eng:        engine.New(cfg.limits()),
		recs:       make(map[wire.JobID]*ioRecord),
		spaceCh:    make(chan struct{}),
		drainCh:    make(chan struct{}),
	}
	for i := range u.replicas {
		u.targets[i] = cfg.Targets[i]
		u.replicas[i] = newReplica(u, i)
	}
	return u, nil
}

// Activate negotiates a session with every downstairs, checks that they
// serve the same region, and activates it with generation gen, which fences
// any upstairs that activated with a lower one. It waits up to
// Config.ActivationQuorumWait for all three, then goes ahead with two; a
// replica that missed the activation is faulted and brought back by live
// repair once it is reachable. Before guest IO starts, extents on which
// the replicas disagree are reconciled (reconcileActivation); progress is
// published from New on (ActivationProgress, SubscribeActivation) and
// its final value is always delivered. Replicas
// that disagree on the region's UUID or geometry make Activate fail with an
// error wrapping ErrRegionMismatch that names them.
func (u *Upstairs) Activate(ctx context.Context, gen ids.Generation) error {
	u.mu.Lock()
	switch {
	case u.closed:
		u.mu.Unlock()
		return fmt.Errorf("activating volume: %w", ErrClosed)
	case u.act != nil:
		u.mu.Unlock()
		return fmt.Errorf("activating volume: already activated")
	}
	a := &activation{gen: gen, changed: make(chan struct{}), proceed: make(chan struct{})}
	u.act, u.gen = a, gen
	u.started = true
	for _, r := range u.replicas {
		u.wg.Add(1)
		go r.run()
	}
	u.mu.Unlock()

	err := u.activate(ctx, a)
	if err != nil {
		u.actTracker.Fail(err)
		// Leave nothing running: an upstairs that failed to activate is
		// only good for Close.
		u.mu.Lock()
		u.eng.Stop(err)
		a.notifyLocked()
		u.stepLocked()
		u.finishLocked()
		u.cancel()
		return fmt.Errorf("activating volume: %w", err)
	}
	u.actTracker.Finish()
	return nil
}

func (u *Upstairs) activate(ctx context.Context, a *activation) error {
	quorumTimer := time.NewTimer(u.cfg.ActivationQuorumWait)
	defer quorumTimer.Stop()
	quorumWaited := false
	// Phase 1: sessions negotiated; regions compared.
	for {
		u.mu.Lock()
		n, fatal := a.countLocked(func(r int) bool { return a.region[r] != nil })
		if fatal != nil {
			u.mu.Unlock()
			return fatal
		}
		if n == engine.ReplicaCount || quorumWaited && n >= engine.Quorum {
			err := u.checkRegionsLocked(a)
			if err == nil {
				a.decided = true
				close(a.proceed)
			}
			u.mu.Unlock()
			if err != nil {
				return err
			}
			break
		}
		ch := a.changed
		u.mu.Unlock()
		select {
		case <-ch:
		case <-quorumTimer.C:
			quorumWaited = true
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	// Phase 2: the replicas that negotiated activate with gen.
	for {
		u.mu.Lock()
		n, fatal := a.countLocked(func(r int) bool { return a.done[r] })
		if fatal != nil {
			u.mu.Unlock()
			return fatal
		}
		waiting := 0
		for r := range engine.ReplicaCount {
			if a.region[r] != nil && !a.done[r] && a.err[r] == nil {
				waiting++
			}
		}
		if waiting == 0 {
			u.mu.Unlock()
			if n < engine.Quorum {
				return fmt.Errorf("%d of %d replicas activated: %w", n, engine.ReplicaCount, ErrNotEnoughReplicas)
			}
			if err := u.reconcileActivation(ctx, a); err != nil {
				return err
			}
			u.mu.Lock()
			u.startIOLocked(a)
			u.mu.Unlock()
			return nil
		}
		ch := a.changed
		u.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// countLocked counts replicas for which ok holds, and returns a fencing or
// generation error any replica met, which ends the activation.
func (a *activation) countLocked(ok func(r int) bool) (int, error) {
	n := 0
	for r := range engine.ReplicaCount {
		if err := a.err[r]; errors.Is(err, ErrFenced) || errors.Is(err, ErrGenTooLow) || errors.Is(err, ErrRegionMismatch) {
			return 0, err
		}
		if ok(r) {
			n++
		}
	}
	return n, nil
}

// notifyLocked wakes Activate.
func (a *activation) notifyLocked() {
	close(a.changed)
	a.changed = make(chan struct{})
}

// checkRegionsLocked compares the regions of the replicas that negotiated
// with each other and with the configured region, naming every difference.
func (u *Upstairs) checkRegionsLocked(a *activation) error {
	var errs []error
	ref := -1
	for r := range engine.ReplicaCount {
		if a.region[r] == nil {
			continue
		}
		if want := u.cfg.Region; !regionMatchesConfig(*a.region[r], want) {
			errs = append(errs, fmt.Errorf("replica %d (%s): serves %s, configured %s",
				r, u.targets[r], describeRegion(*a.region[r]), describeRegion(want)))
			continue
		}
		if ref < 0 {
			ref = r
			continue
		}
		if d := regionDiff(*a.region[ref], *a.region[r]); d != "" {
			errs = append(errs, fmt.Errorf("replica %d (%s) and replica %d (%s): %s",
				ref, u.targets[ref], r, u.targets[r], d))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", ErrRegionMismatch, errors.Join(errs...))
	}
	u.region = *a.region[ref]
	u.blockSize = int(u.region.BlockSize)
	return nil
}

func regionMatchesConfig(got, want wire.RegionInfo) bool {
	var zero [16]byte
	return (want.UUID == zero || want.UUID == got.UUID) &&
		(want.BlockSize == 0 || want.BlockSize == got.BlockSize) &&
		(want.ExtentBlocks == 0 || want.ExtentBlocks == got.ExtentBlocks) &&
		(want.ExtentCount == 0 || want.ExtentCount == got.ExtentCount)
}

// regionDiff names how b differs from a, or returns "".
func regionDiff(a, b wire.RegionInfo) string {
	switch {
	case a.UUID != b.UUID:
		return fmt.Sprintf("region uuid %s differs from %s", b.UUID, a.UUID)
	case a.BlockSize != b.BlockSize:
		return fmt.Sprintf("block size %d differs from %d", b.BlockSize, a.BlockSize)
	case a.ExtentBlocks != b.ExtentBlocks:
		return fmt.Sprintf("extent size %d blocks differs from %d", b.ExtentBlocks, a.ExtentBlocks)
	case a.ExtentCount != b.ExtentCount:
		return fmt.Sprintf("extent count %d differs from %d", b.ExtentCount, a.ExtentCount)
	}
	return ""
}

func describeRegion(r wire.RegionInfo) string {
	return fmt.Sprintf("region %s (%d-byte blocks, %d blocks per extent, %d extents)",
		r.UUID, r.BlockSize, r.ExtentBlocks, r.ExtentCount)
}

// startIOLocked turns the activation into running IO: replicas that
// activated are Active, the rest Faulted; flush numbers continue after the
// highest any replica has.
func (u *Upstairs) startIOLocked(a *activation) {
	var active [engine.ReplicaCount]bool
	var maxFlush uint64
	for r := range engine.ReplicaCount {
		active[r] = a.done[r]
		for _, v := range a.versions[r] {
			maxFlush = max(maxFlush, v.Flush)
		}
	}
	u.eng.SetExtentBlocks(u.region.ExtentBlocks)
	for r, rep := range u.replicas {
		if !active[r] {
			rep.cause = fmt.Errorf("replica %d missed the activation", r)
			if err := cmp.Or(a.err[r], rep.lastErr); err != nil {
				rep.cause = fmt.Errorf("replica %d missed the activation: %w", r, err)
			}
		}
	}
	u.eng.Activate(active, maxFlush+1)
	a.notifyLocked() // replicas waiting in activated go on to serve IO
	u.stepLocked()
	for _, rep := range u.replicas {
		rep.cause = nil
	}
	for r := range engine.ReplicaCount {
		if a.done[r] {
			u.log.Info("replica active", "replica", r, "target", u.targets[r], "gen", a.gen)
		}
	}
}

// Deactivate flushes and waits until every connected replica has answered
// every job it was sent, so that all three hold the same data (an Offline
// replica keeps its backlog). IO submitted meanwhile is still served. Close
// deactivates (bounded by Config.DeactivateTimeout) before stopping.
func (u *Upstairs) Deactivate(ctx context.Context) error {
	if err := u.Flush(ctx); err != nil {
		return fmt.Errorf("deactivating volume: %w", err)
	}
	u.mu.Lock()
	for !u.eng.Drained() {
		u.drainWaiters++
		ch := u.drainCh
		u.finishLocked()
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("deactivating volume: %w", ctx.Err())
		}
		u.mu.Lock()
	}
	u.mu.Unlock()
	return nil
}

// Close deactivates the volume if it is active (see Deactivate; at most
// Config.DeactivateTimeout), then stops all IO (pending calls fail with
// ErrClosed), closes every connection and waits for every goroutine to
// end. No goroutine, connection or buffer survives it.
func (u *Upstairs) Close() error {
	u.mu.Lock()
	if u.closed {
		u.mu.Unlock()
		return nil
	}
	// Deactivating needs a quorum of connected replicas; without one a
	// flush would only wait for the Offline ones until the timeout.
	active := 0
	for r := range engine.ReplicaCount {
		if u.eng.State(r) == engine.ReplicaActive {
			active++
		}
	}
	running := u.eng.Running() && active >= engine.Quorum
	u.closing = true
	u.mu.Unlock()
	var err error
	if running {
		ctx, cancel := context.WithTimeout(u.ctx, u.cfg.DeactivateTimeout)
		err = u.Deactivate(ctx)
		cancel()
		if errors.Is(err, ErrFenced) || errors.Is(err, ErrNotEnoughReplicas) || errors.Is(err, ErrClosed) {
			err = nil // nothing to hand over
		}
	}
	u.mu.Lock()
	if u.closed {
		u.mu.Unlock()
		return nil
	}
	u.closed = true
	u.eng.Stop(ErrClosed)
	u.stepLocked()
	u.finishLocked()
	u.cancel()
	u.wg.Wait()
	if err != nil {
		return fmt.Errorf("closing volume: %w", err)
	}
	return nil
}

// fence stops all IO with ErrFenced after a downstairs said another
// upstairs took over.
func (u *Upstairs) fence(r int, byGen ids.Generation) {
	u.mu.Lock()
	if u.eng.StopErr() != nil {
		u.mu.Unlock()
		return
	}
	u.log.Warn("fenced by a higher generation", "replica", r, "gen", u.gen, "by_gen", byGen)
	u.eng.Stop(fmt.Errorf("replica %d reports generation %d: %w", r, byGen, ErrFenced))
	u.stepLocked()
	u.finishLocked()
}

// stepLocked carries out the engine's actions. Cheap ones (bookkeeping,
// wakeups, completions on buffered channels) and rare ones (read repair)
// happen here under mu; privatizing copies are collected for finishLocked,
// which copies with mu released.
func (u *Upstairs) stepLocked() {
	for {
		acts := u.eng.TakeActions()
		if len(acts) == 0 {
			break
		}
		for _, a := range acts {
			u.applyLocked(a)
		}
	}
	if u.spaceWaiters > 0 && !u.eng.Full(0) {
		close(u.spaceCh)
		u.spaceCh = make(chan struct{})
		u.spaceWaiters = 0
	}
	if u.drainWaiters > 0 && u.eng.Drained() {
		close(u.drainCh)
		u.drainCh = make(chan struct{})
		u.drainWaiters = 0
	}
}

func (u *Upstairs) applyLocked(a engine.Action) {
	switch a.Kind {
	case engine.ActWake:
		u.replicas[a.Replica].wakeUp()
	case engine.ActComplete:
		rec := u.recs[a.ID]
		if rec == nil || rec.waiter == nil {
			return
		}
		w := rec.waiter
		rec.waiter = nil
		if a.Err != nil && w.err == nil {
			w.err = a.Err
		}
		w.pending--
		if w.pending == 0 {
			w.ch <- struct{}{}
		}
	case engine.ActRetire:
		if rec := u.recs[a.ID]; rec != nil {
			delete(u.recs, a.ID)
			u.pools.putRecord(rec)
		}
	case engine.ActPrivatize:
		u.privatize = append(u.privatize, a.ID)
	case engine.ActRepairRead:
		u.repairLocked(a)
	case engine.ActRewrite:
		parent, child := u.recs[a.Parent], u.pools.record()
		if parent != nil && parent.priv != nil {
			parent.priv.refs++
			child.priv, child.data, child.hashes = parent.priv, parent.priv.data, parent.priv.hashes
			child.start = parent.start
		}
		u.recs[a.ID] = child
	case engine.ActState:
		u.log.Info("replica state", "replica", a.Replica, "target", u.targets[a.Replica], "state", a.State)
		u.replicas[a.Replica].stateChanged(a.State, a.Event)
		close(u.stateCh)
		u.stateCh = make(chan struct{})
	}
}

// finishLocked runs the privatizing copies with mu released, re-locking to
// report their results, until none are left; it returns with mu unlocked.
func (u *Upstairs) finishLocked() {
	for n := len(u.privatize); n > 0; n = len(u.privatize) {
		id := u.privatize[n-1]
		u.privatize = u.privatize[:n-1]
		u.privatizeLocked(id)
	}
	u.mu.Unlock()
}

// privatizeLocked copies write id's data out of the caller's buffer (with
// mu released: the caller is still blocked, so the buffer is stable unless
// the caller races with itself) and reports whether the hashes still hold.
func (u *Upstairs) privatizeLocked(id wire.JobID) {
	rec := u.recs[id]
	if rec == nil {
		u.eng.Privatized(id, true)
		u.stepLocked()
		return
	}
	blocks := len(rec.hashes)
	b := u.pools.buf(len(rec.data), blocks)
	src, bs := rec.data, 0
	if blocks > 0 {
		bs = len(src) / blocks
	}
	u.mu.Unlock()
	if h := u.ioHooks; h != nil && h.privatizing != nil {
		h.privatizing(id)
	}
	copy(b.data, src)
	hashBlocks(b.hashes, b.data, bs)
	u.mu.Lock()
	same := true
	for i, h := range b.hashes {
		if rec.hashes[i] != h {
			same = false
			break
		}
	}
	rec.priv, rec.data, rec.hashes = b, b.data, b.hashes
	u.eng.Privatized(id, same)
	u.stepLocked()
}

// repairLocked rewrites the blocks of read a.id on replica a.replica, which
// returned data that failed verification, from the good data now in the
// caller's buffer. It runs while the engine's actions are applied, before
// the read's completion releases the caller, and must not step the engine
// itself: the actions it causes are applied by the loop in stepLocked.
func (u *Upstairs) repairLocked(a engine.Action) {
	// The engine may have retired the read already; its record lives until
	// the actRetire that follows.
	rec := u.recs[a.ID]
	if rec == nil || u.blockSize == 0 {
		return
	}
	blocks := len(rec.data) / u.blockSize
	b := u.pools.buf(len(rec.data), blocks)
	copy(b.data, rec.data)
	hashBlocks(b.hashes, b.data, u.blockSize)
	id, ok := u.eng.SubmitRepair(a.Replica, a.ID, rec.start, uint32(blocks), len(b.data))
	if !ok {
		u.pools.unref(b)
		u.log.Info("not rewriting blocks that failed verification: newer write or replica gone",
			"replica", a.Replica, "first_block", rec.start, "blocks", blocks)
		return
	}
	r := u.pools.record()
	r.priv, r.data, r.hashes, r.start = b, b.data, b.hashes, rec.start
	u.recs[id] = r
	u.stats.blocksRewritten.Add(uint64(blocks))
	u.log.Warn("rewriting blocks that failed verification from a peer's copy",
		"replica", a.Replica, "first_block", rec.start, "blocks", blocks)
}

// Status is a snapshot of the upstairs for operators.
type Status struct {
	// Active is true between a successful Activate and Close or fencing.
	Active bool
	// Gen is the activation generation.
	Gen ids.Generation
	// Region is the agreed region geometry (zero before activation).
	Region wire.RegionInfo
	// Replicas describes each downstairs, in target order.
	Replicas [engine.ReplicaCount]ReplicaStatus
	// LiveJobs and LiveBytes count jobs not yet retired by every replica.
	LiveJobs  int
	LiveBytes int64
	// Err is why IO stopped (fenced, closed), if it did.
	Err error
	// Activation is the activation's progress.
	Activation reconcile.Progress
}

// ReplicaStatus describes one downstairs.
type ReplicaStatus struct {
	// Target is the downstairs address.
	Target string
	// State is the replica's state.
	State engine.ReplicaState
	// OutstandingJobs and OutstandingBytes count jobs the replica owes: in
	// flight when Active, the replay backlog when Offline.
	OutstandingJobs  int
	OutstandingBytes int64
	// LastError is the last connection error, if any: after the replica
	// was dropped, usually why its latest reconnect attempt failed.
	LastError string
	// FaultReason is why the replica last stopped serving IO (went
	// Offline or Faulted): the error that ended its session, the
	// protocol violation, the job it failed, the backlog it overflowed.
	// When it fell further since (Offline, then Faulted) it also names the
	// first reason. Unlike LastError, reconnect attempts leave it alone;
	// it is cleared once the replica is Active again.
	FaultReason string
	// FaultedAt is when the replica first stopped serving IO since it was
	// last Active; zero when FaultReason is empty.
	FaultedAt time.Time
	// Repair is the progress of the replica's current or latest live
	// repair; nil when it never had one.
	Repair *reconcile.Progress
}

// ReplicaStateChanged returns a channel closed at the next change of any
// replica's state: take it, read Status, and wait on it if Status does
// not show what you wait for yet.
func (u *Upstairs) ReplicaStateChanged() <-chan struct{} {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.stateCh
}

// Status returns a snapshot of the upstairs.
func (u *Upstairs) Status() Status {
	u.mu.Lock()
	defer u.mu.Unlock()
	liveJobs, liveBytes := u.eng.Live()
	s := Status{
		Active:    u.eng.Running(),
		Gen:       u.gen,
		Region:    u.region,
		LiveJobs:  liveJobs,
		LiveBytes: int64(liveBytes),
		Err:       u.eng.StopErr(),

		Activation: u.actTracker.Status(),
	}
	for r := range engine.ReplicaCount {
		owedJobs, owedBytes := u.eng.Owed(r)
		s.Replicas[r] = ReplicaStatus{
			Target:           u.targets[r],
			State:            u.eng.State(r),
			OutstandingJobs:  owedJobs,
			OutstandingBytes: int64(owedBytes),
			LastError:        u.replicas[r].lastErrLocked(),
			FaultReason:      u.replicas[r].faultReasonLocked(),
			FaultedAt:        u.replicas[r].faultedAt,
		}
		if slot := u.live[r]; slot.tracker != nil && slot.claimed {
			p := slot.tracker.Status()
			s.Replicas[r].Repair = &p
		}
	}
	return s
}
