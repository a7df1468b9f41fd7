package upstairs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

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
	// stepCh, once StatusChanged made it, is closed (and dropped) at the
	// end of the next step.
	stepCh chan struct{}
	// live is each replica's live-repair bookkeeping.
	live [engine.ReplicaCount]liveRepairSlot
	// restart is the restart reconciliation's (restart_reconcile.go).
	restart restartState
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
