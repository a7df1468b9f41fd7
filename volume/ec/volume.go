package ec

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"tern/volume/ids"
	"tern/volume/reconcile"
	"tern/volume/transport"
	"tern/volume/wire"
)

// Volume is an erasure-coded volume client: client blocks striped over
// Layout.Data data shards with Layout.Parity parity shards, each shard a
// region on its own downstairs. Its IO methods are safe for concurrent
// use; p is not touched after they return.
type Volume struct {
	// Immutable after New.
	cfg    Config
	codec  *Codec
	log    *slog.Logger
	ctx    context.Context // ends when Close starts
	cancel context.CancelFunc
	wg     sync.WaitGroup // shard goroutines
	// ioWG counts the goroutines an IO leaves waiting for a shard's
	// answer after it returned (see goIO).
	ioWG  sync.WaitGroup
	locks stripeLocks
	// actTracker publishes the activation's progress from New on.
	actTracker *reconcile.Tracker

	// mu guards everything below.
	mu     sync.Mutex
	shards []*shard
	// started: the shard goroutines run (Activate was called).
	started bool
	act     *activation
	// running: activation finished; IO is served.
	running bool
	closing bool
	// ioDone: Close waits for ioWG; goIO starts nothing more.
	ioDone bool
	// stopErr is why IO stopped for good (fenced, closed).
	stopErr error
	gen     ids.Generation
	region  wire.RegionInfo // every shard's geometry, once activated
	bs      int
	stripes uint64 // stripes of the volume: a shard's blocks but its last
	// metaBlock is the shard block holding its metadata (shard_meta.go).
	metaBlock StripeIndex
	// refVersions are each extent's greatest version at activation, what a
	// shard joining later is compared with.
	refVersions []wire.ExtentVersion
	// refMeta is the newest flush any shard's metadata named at
	// activation.
	refMeta  uint64
	flushNum uint64
	// stateCh is closed (and replaced) whenever a shard attaches or
	// detaches, or a repair ends.
	stateCh chan struct{}
}

// shard is one downstairs of the volume.
type shard struct {
	id     int
	target string
	// Guarded by Volume.mu.
	sess *session // the activated session, nil when not connected
	// attachedOnce: the shard took part in this activation (at the
	// activation or by joining later), so its missed set is complete.
	attachedOnce bool
	missed       stripeSet
	// held is the extents (not stripes) of the shard's region this volume
	// knows hold data: written, rewritten or metadata sent to it, or not
	// pristine when it joined. One that the shard reports pristine when it
	// joins again lost its data (a replaced region).
	held        stripeSet
	kick        chan struct{} // one slot: the repair loop should look again
	repair      *reconcile.Tracker
	lastErr     string
	faultReason string
	// sessions counts the sessions attached, at activation or joining.
	sessions uint64
}

// activation is the handshake state while Activate runs.
type activation struct {
	region  []*wire.RegionInfo // by shard: hello answered
	err     []error            // by shard: the last failure
	decided bool
	// collected: Activate took the activated sessions; later ones join
	// the running volume.
	collected bool
	include   []bool
	proceed   chan struct{} // closed when decided
	done      []*session    // activated sessions of included shards
	failed    []error
	changed   chan struct{} // closed (and replaced) on any change
}

func (a *activation) notifyLocked() {
	close(a.changed)
	a.changed = make(chan struct{})
}

// New validates cfg and returns a Volume that connects when Activate is
// called.
func New(cfg Config) (*Volume, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("creating erasure-coded volume: %w", err)
	}
	codec, err := NewCodec(cfg.Layout)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	v := &Volume{
		cfg: cfg, codec: codec, ctx: ctx, cancel: cancel,
		log:        cfg.Logger.With("component", "ec", "layout", cfg.Layout.String(), "upstairs_id", cfg.UpstairsID),
		actTracker: reconcile.NewTracker(nil),
		stateCh:    make(chan struct{}),
	}
	for i, t := range cfg.Targets {
		v.shards = append(v.shards, &shard{id: i, target: t, kick: make(chan struct{}, 1)})
	}
	return v, nil
}

// Layout is the volume's layout.
func (v *Volume) Layout() Layout { return v.cfg.Layout }

// BlockSize is the client block size (the shards' region block size), 0
// before activation.
func (v *Volume) BlockSize() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.bs
}

// SizeBytes is the volume's size in bytes: Layout.Data times a shard's
// region but its metadata block; 0 before activation.
func (v *Volume) SizeBytes() uint64 {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.cfg.Layout.VolumeBlocks(v.stripes) * uint64(v.bs)
}

// notifyLocked wakes everyone waiting for a change of shard states.
func (v *Volume) notifyLocked() {
	close(v.stateCh)
	v.stateCh = make(chan struct{})
}

// runShard is shard i's owner goroutine: it dials, activates, serves the
// session until it ends and dials again, with backoff, until Close.
func (v *Volume) runShard(i int) {
	defer v.wg.Done()
	sh := v.shards[i]
	backoff := v.cfg.ReconnectMin
	for v.ctx.Err() == nil {
		err := v.connectShard(sh)
		if v.ctx.Err() != nil {
			return
		}
		if err != nil {
			v.mu.Lock()
			sh.lastErr = err.Error()
			if a := v.act; a != nil && !a.decided {
				a.err[i] = err
				a.notifyLocked()
			}
			v.mu.Unlock()
			v.log.Debug("shard session failed", "shard", i, "target", sh.target, "err", err)
		} else {
			backoff = v.cfg.ReconnectMin
		}
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-v.ctx.Done():
			t.Stop()
			return
		}
		backoff = min(2*backoff, v.cfg.ReconnectMax)
	}
}

// connectShard runs one session of sh: dial, hello, wait to be let in,
// activate, serve until it ends. nil means a session was served.
func (v *Volume) connectShard(sh *shard) error {
	dctx, cancel := context.WithTimeout(v.ctx, v.cfg.ReplyTimeout)
	s, err := dialSession(dctx, sessionParams{
		target: sh.target, tls: v.cfg.TLS, region: v.cfg.Region, upstairsID: v.cfg.UpstairsID,
		dial: transport.DialOptions{KeepAlivePeriod: v.cfg.KeepAlivePeriod, IdleTimeout: v.cfg.IdleTimeout, Network: v.cfg.Network},
	})
	cancel()
	if err != nil {
		return fmt.Errorf("shard %d (%s): %w", sh.id, sh.target, err)
	}
	gen, err := v.await(sh, s.region)
	if err != nil {
		s.close("not needed")
		return err
	}
	actx, cancel := context.WithTimeout(v.ctx, v.cfg.ReplyTimeout)
	err = s.activate(actx, v.cfg.UpstairsID, gen)
	cancel()
	if err != nil {
		s.close("activation failed")
		err = fmt.Errorf("shard %d (%s): %w", sh.id, sh.target, err)
		if errors.Is(err, ErrFenced) {
			v.fence(err)
		}
		v.activationFailed(sh, err)
		return err
	}
	var meta uint64
	if v.isRunning() {
		mctx, cancel := context.WithTimeout(v.ctx, v.cfg.ReplyTimeout)
		meta, err = v.readMeta(mctx, sh.id, s)
		cancel()
		if err != nil {
			s.close("bad metadata")
			return fmt.Errorf("shard %d (%s): %w", sh.id, sh.target, err)
		}
	}
	if !v.attach(sh, s, meta) {
		s.close("not needed")
		<-s.done
		return nil
	}
	v.wg.Add(1)
	go v.repairLoop(sh, s)
	select {
	case <-s.done:
	case <-v.ctx.Done():
		s.close("closing")
		<-s.done
	}
	v.detach(sh, s)
	if errors.Is(s.err, ErrFenced) {
		v.fence(fmt.Errorf("shard %d (%s): %w", sh.id, sh.target, s.err))
	}
	return nil
}

// await reports a shard's region and returns the generation to activate
// with once the activation lets it in (or the volume runs and it joins).
func (v *Volume) await(sh *shard, region wire.RegionInfo) (ids.Generation, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for {
		if v.stopErr != nil {
			return 0, v.stopErr
		}
		if v.running {
			if d := regionDiff(v.region, region); d != "" {
				return 0, fmt.Errorf("shard %d (%s): %s: %w", sh.id, sh.target, d, ErrRegionMismatch)
			}
			return v.gen, nil
		}
		a := v.act
		if !a.decided {
			// Notify only news: every waiting shard wakes on a
			// notification, and one that notified again on each wake-up
			// would keep the others spinning with it until the last
			// shard answered (the EC simulation found this).
			if a.region[sh.id] == nil {
				a.notifyLocked()
			}
			a.region[sh.id] = &region
		} else if a.include[sh.id] {
			return v.gen, nil
		}
		ch := a.changed
		v.mu.Unlock()
		select {
		case <-ch:
		case <-v.ctx.Done():
			v.mu.Lock()
			return 0, v.ctx.Err()
		}
		v.mu.Lock()
	}
}

func (v *Volume) activationFailed(sh *shard, err error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if a := v.act; a != nil && !v.running {
		a.failed[sh.id] = err
		a.notifyLocked()
	}
}

// attach makes an activated session sh's: during activation it is handed
// to Activate; later the shard joins, with the stripes it may be wrong
// on marked for its repair loop. false: the session is not wanted.
func (v *Volume) attach(sh *shard, s *session, meta uint64) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.stopErr != nil || v.closing {
		return false
	}
	for !v.running && v.act.collected && v.stopErr == nil && !v.closing {
		// Activation took its sessions and is reconciling: join after.
		ch := v.stateCh
		v.mu.Unlock()
		select {
		case <-ch:
		case <-v.ctx.Done():
		}
		v.mu.Lock()
	}
	if v.stopErr != nil || v.closing {
		return false
	}
	if !v.running {
		v.noteHeldLocked(sh, s)
		v.act.done[sh.id] = s
		v.act.notifyLocked()
		return true
	}
	v.markSuspectLocked(sh, s, meta)
	v.noteHeldLocked(sh, s)
	sh.sess, sh.attachedOnce = s, true
	sh.sessions++
	sh.lastErr, sh.faultReason = "", ""
	v.log.Info("shard joined", "shard", sh.id, "target", sh.target, "stripes_to_check", sh.missed.count)
	v.notifyLocked()
	return true
}

// markSuspectLocked marks the stripes of every extent sh may hold wrong
// blocks of when it (re)joins a running volume: those written since its
// last flush when it may have lost writes (a crash), and, the first time
// it joins (it missed the activation), those dirty on it or written on a
// peer after the last flush its metadata (meta) names; and every extent
// the volume knows it held data on that it now reports pristine (the
// region was replaced by an empty one, whose blocks read as zeros without
// failing a hash).
func (v *Volume) markSuspectLocked(sh *shard, s *session, meta uint64) {
	for e, ver := range s.versions {
		suspect := s.lostWrites && ver.Dirty || sh.held.has(StripeIndex(e)) && pristine(ver)
		if !sh.attachedOnce {
			suspect = suspect || ver.Dirty || v.refVersions[e].Flush > meta
		}
		if suspect {
			v.markExtentLocked(sh, e)
		}
	}
}

// pristine reports whether an extent's version is a new region's: never
// flushed, never written.
func pristine(ver wire.ExtentVersion) bool { return ver.Gen == 0 && ver.Flush == 0 && !ver.Dirty }

// noteHeldLocked records the extents session s of sh reports holding
// data (not pristine).
func (v *Volume) noteHeldLocked(sh *shard, s *session) {
	for e, ver := range s.versions {
		if !pristine(ver) {
			sh.held.add(StripeIndex(e))
		}
	}
}

// noteWrittenLocked records that blocks [first, last] of sh's region are
// being written.
func (v *Volume) noteWrittenLocked(sh *shard, first, last StripeIndex) {
	eb := StripeIndex(v.region.ExtentBlocks)
	for e := first / eb; e <= last/eb; e++ {
		sh.held.add(e)
	}
}

// markExtentLocked marks every stripe of extent e behind on sh.
func (v *Volume) markExtentLocked(sh *shard, e int) {
	eb := StripeIndex(v.region.ExtentBlocks)
	sh.missed.addRange(StripeIndex(e)*eb, min(StripeIndex(e+1)*eb, StripeIndex(v.stripes))-1)
}

func (v *Volume) isRunning() bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.running
}

// readMeta reads shard i's metadata block and returns the flush it names
// (0 for a shard that never took one). A record of another layout, shard
// index or region is refused: the target is not shard i of this volume.
func (v *Volume) readMeta(ctx context.Context, i int, s *session) (uint64, error) {
	v.mu.Lock()
	at, uid := v.metaBlock, v.region.UUID
	v.mu.Unlock()
	buf := make([]byte, v.bs)
	ok, _, err := v.shardRead(ctx, i, s, at, 1, buf)
	if err != nil {
		return 0, fmt.Errorf("reading shard metadata: %w", err)
	}
	if !ok[0] {
		v.log.Warn("shard metadata fails its hash; treating the shard as behind everywhere", "shard", i)
		return 0, nil
	}
	m, present, err := decodeShardMeta(buf)
	if err != nil {
		v.log.Warn("shard metadata unreadable; treating the shard as behind everywhere", "shard", i, "err", err)
		return 0, nil
	}
	if !present {
		return 0, nil
	}
	if m.Layout != v.cfg.Layout || m.Shard != i || m.Region != uid {
		return 0, fmt.Errorf("target %d holds shard %d of a %v volume of region %v, not shard %d of this %v volume: %w",
			i, m.Shard, m.Layout, m.Region, i, v.cfg.Layout, ErrRegionMismatch)
	}
	return m.Flush, nil
}

// detach records that sh's session s ended.
func (v *Volume) detach(sh *shard, s *session) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if sh.sess == s {
		sh.sess = nil
		sh.faultReason = fmt.Sprint(s.err)
		if s.dropped != nil {
			sh.faultReason = s.dropped.Error()
		}
		if v.closing || v.ctx.Err() != nil {
			v.log.Debug("shard session closed", "shard", sh.id, "target", sh.target)
		} else {
			v.log.Warn("shard dropped", "shard", sh.id, "target", sh.target, "err", s.err)
		}
		v.notifyLocked()
	}
}

// dropShard ends sh's session s after a request on it failed, so no later
// request trusts what it holds; its stripes in missed were marked by the
// caller.
func (v *Volume) dropShard(sh *shard, s *session, why error) {
	v.mu.Lock()
	if s.dropped == nil {
		s.dropped = why
	}
	v.mu.Unlock()
	s.close("request failed")
}

// fence stops all IO for good: another upstairs took the shards over.
func (v *Volume) fence(err error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.stopErr == nil {
		v.log.Warn("fenced by a higher generation", "err", err)
		v.stopErr = err
		v.notifyLocked()
	}
}

// Close flushes (at most Config.DeactivateTimeout) if the volume runs,
// then closes every session and waits for every goroutine.
func (v *Volume) Close() error {
	v.mu.Lock()
	if v.closing {
		v.mu.Unlock()
		return nil
	}
	running := v.running && v.stopErr == nil
	v.mu.Unlock()
	var err error
	if running {
		ctx, cancel := context.WithTimeout(v.ctx, v.cfg.DeactivateTimeout)
		err = v.deactivate(ctx)
		cancel()
		if errors.Is(err, ErrFenced) {
			err = nil
		}
	}
	v.mu.Lock()
	v.closing = true
	if v.stopErr == nil {
		v.stopErr = ErrClosed
	}
	v.notifyLocked()
	v.mu.Unlock()
	v.cancel()
	v.wg.Wait()
	v.mu.Lock()
	v.ioDone = true
	v.mu.Unlock()
	v.ioWG.Wait()
	if err != nil {
		return fmt.Errorf("closing volume: %w", err)
	}
	return nil
}

// goIO runs f on a goroutine Close waits for; false (f not run) once
// Close is past that point.
func (v *Volume) goIO(f func()) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.ioDone {
		return false
	}
	v.ioWG.Add(1)
	go func() {
		defer v.ioWG.Done()
		f()
	}()
	return true
}
