package upstairs

import (
	"context"
	"errors"
	"fmt"
	"time"

	"tern/volume/ids"
	"tern/volume/reconcile"
	"tern/volume/upstairs/engine"
	"tern/volume/wire"
)

// Live repair brings back a replica that missed the activation, was
// faulted (backlog overflow, a failed job) or was replaced, while guest
// IO continues. The trigger is the replica's own goroutine: while the
// upstairs runs, a Faulted replica keeps dialling (with backoff), and a
// session that negotiates the right region moves it to Repairing
// (replica.await). Once that session serves, startLiveRepairLocked starts
// one repair goroutine for it:
//
//  1. A reconcile.LiveRepair walk is attached to the engine, which routes
//     guest writes to the replica by extent (engine/live_repair.go).
//  2. For each extent the walk hands out (Next, under Upstairs.mu, so every
//     write submitted afterwards is routed with the extent under repair):
//     ask an Active source for the extent's version and hashes — the call
//     is sent after every job queued to the source before it, so it sees
//     every earlier write — and the target for its own; if they differ,
//     copy the differing blocks (every block with RepairWholeExtents) and
//     stamp the source's version; then Done releases the writes held for
//     that extent, which reach the target after the copy.
//  3. After the last extent the replica is Active and a flush follows.
//
// Any failure (the target's or the source's session ends, the upstairs
// closes) aborts: the walk is detached, held writes are skipped, the
// replica is Faulted, and its goroutine's next session retries from
// extent 0 with a new Tracker.

// liveRepairSlot is the live-repair bookkeeping of one replica; guarded
// by Upstairs.mu.
type liveRepairSlot struct {
	// running: a repair goroutine works on this replica.
	running bool
	// tracker is the current or latest attempt's progress; a subscriber
	// before any attempt gets one that the next attempt takes over.
	tracker *reconcile.Tracker
	// claimed: tracker belongs to an attempt (not just waiting for one).
	claimed bool
	// source is the replica the current or latest attempt copies from;
	// badSource is 1 + the replica that served bad data (a block it
	// refused as corrupt, or data the target refused as not matching its
	// hashes) to the latest attempt, 0 if none: the next attempt copies
	// from another Active replica when there is one, so a silently
	// damaged block on one source cannot stall the repair forever.
	source    int
	badSource int
}

// startLiveRepairLocked starts the live repair of replica r on its session
// epoch, if r is Repairing and none runs.
func (u *Upstairs) startLiveRepairLocked(r int, epoch uint64) {
	slot := &u.live[r]
	if u.eng.State(r) != engine.ReplicaRepairing || !u.eng.Running() || slot.running {
		return
	}
	walk := reconcile.NewLiveRepair(u.region.ExtentCount)
	u.eng.AttachLiveRepair(r, walk)
	if slot.tracker == nil || slot.claimed {
		slot.tracker = reconcile.NewTracker(nil)
	}
	slot.running, slot.claimed = true, true
	t := slot.tracker
	_ = t.SetPhase(reconcile.PhaseLiveRepair)
	t.GrowTotals(uint64(u.region.ExtentCount), 0)
	u.log.Info("live repair started", "replica", r, "target", u.targets[r], "extents", u.region.ExtentCount)
	u.wg.Add(1)
	go u.runLiveRepair(r, epoch, walk, t)
}

// runLiveRepair is the goroutine of one live-repair attempt.
func (u *Upstairs) runLiveRepair(r int, epoch uint64, walk *reconcile.LiveRepair, t *reconcile.Tracker) {
	defer u.wg.Done()
	start := time.Now()
	err := u.liveRepair(u.ctx, r, epoch, walk, t)
	u.mu.Lock()
	u.eng.DetachLiveRepair(r, walk)
	u.live[r].running = false
	if err == nil && !u.eng.RepairDone(r) {
		err = fmt.Errorf("replica %d left repair as %v: %w", r, u.eng.State(r), ErrNoSession)
	}
	switch {
	case err == nil:
		u.live[r].badSource = 0
	case servedBadData(err):
		u.live[r].badSource = 1 + u.live[r].source
	}
	if err != nil {
		walk.Abort()
		// Writes held for it are skipped.
		u.replicas[r].dropLocked(fmt.Errorf("live repair of replica %d: %w", r, err), func() { u.eng.Fault(r) })
	}
	target := u.targets[r]
	u.stepLocked()
	u.finishLocked()
	u.repairRan(repairLive, start)
	if err != nil {
		u.log.Warn("live repair aborted; the replica stays faulted and is retried when it reconnects",
			"replica", r, "target", target, "err", err)
		t.Fail(err)
		return
	}
	if ferr := u.backgroundFlush(u.ctx); ferr != nil {
		u.log.Warn("flush after live repair failed", "replica", r, "err", ferr)
	}
	u.log.Info("live repair done; replica active", "replica", r, "target", target,
		"seconds", time.Since(start).Seconds())
	t.Finish()
}

// servedBadData reports whether a live repair failed on the source's
// data: a block it refused as corrupt, or blocks the target refused as
// not matching the hashes the source recorded for them.
func servedBadData(err error) bool {
	var corrupt *CorruptBlockError
	return errors.As(err, &corrupt) || errors.Is(err, wire.CodeHashMismatch)
}

// liveRepair walks every extent of replica r (see the comment at the top
// of this file).
func (u *Upstairs) liveRepair(ctx context.Context, r int, epoch uint64, walk *reconcile.LiveRepair, t *reconcile.Tracker) error {
	for {
		u.mu.Lock()
		if st := u.eng.State(r); st != engine.ReplicaRepairing {
			u.mu.Unlock()
			return fmt.Errorf("replica %d is %v", r, st)
		}
		e, ok := walk.Next()
		if !ok {
			u.mu.Unlock()
			return nil // a region without extents
		}
		src := u.eng.LiveRepairSource(r, u.live[r].badSource-1)
		u.live[r].source = src
		u.mu.Unlock()
		if src < 0 {
			return fmt.Errorf("live repair of replica %d: no active replica to copy from: %w", r, ErrNotEnoughReplicas)
		}
		if err := u.liveRepairExtent(ctx, r, epoch, src, ids.ExtentID(e), t); err != nil {
			return fmt.Errorf("live repair of replica %d, extent %d from replica %d: %w", r, e, src, err)
		}
		u.mu.Lock()
		err := walk.Done(e)
		u.replicas[r].wakeUp() // writes held for e may go now
		complete := walk.State() == reconcile.LiveRepairComplete
		u.mu.Unlock()
		if err != nil {
			return err
		}
		t.ExtentDone()
		u.extentRepaired(repairLive)
		if complete {
			return nil
		}
	}
}

// liveRepairExtent makes extent e of target r match replica src.
func (u *Upstairs) liveRepairExtent(ctx context.Context, r int, epoch uint64, src int, e ids.ExtentID, t *reconcile.Tracker) error {
	var srcV, dstV wire.ExtentVersion
	var srcHashes, dstHashes []uint64
	if u.cfg.RepairWholeExtents {
		var err error
		if srcV, err = u.extentVersion(ctx, src, 0, e); err != nil {
			return err
		}
		if dstV, err = u.extentVersion(ctx, r, epoch, e); err != nil {
			return err
		}
	} else {
		sh, err := u.extentHashes(ctx, src, 0, e)
		if err != nil {
			return err
		}
		dh, err := u.extentHashes(ctx, r, epoch, e)
		if err != nil {
			return err
		}
		srcV, srcHashes, dstV, dstHashes = sh.Version, sh.Hashes, dh.Version, dh.Hashes
	}
	if u.hooks != nil && u.hooks.liveExtentCompared != nil {
		u.hooks.liveExtentCompared(r, e)
	}
	if !reconcile.LiveRepairNeeded(fromWireVersion(srcV), fromWireVersion(dstV)) {
		return nil
	}
	blocks, err := u.blocksToCopy(srcHashes, dstHashes, t)
	if err != nil {
		return err
	}
	t.GrowTotals(0, uint64(len(blocks))*uint64(u.blockSize))
	interim := dstV
	interim.Dirty = true
	return u.copyExtent(ctx, extentCopy{
		kind: repairLive, extent: e, src: src, dst: r, dstEpoch: epoch,
		blocks: blocks, interim: interim, final: srcV, tracker: t,
	})
}

// LiveRepairProgress returns the progress of replica's current or latest
// live repair; ok is false when it never had one (and nobody subscribed).
func (u *Upstairs) LiveRepairProgress(replica int) (reconcile.Progress, bool) {
	if replica < 0 || replica >= engine.ReplicaCount {
		return reconcile.Progress{}, false
	}
	u.mu.Lock()
	t := u.live[replica].tracker
	u.mu.Unlock()
	if t == nil {
		return reconcile.Progress{}, false
	}
	return t.Status(), true
}

// SubscribeLiveRepair watches replica's live repair: the one running, or
// if none runs, the next attempt (so subscribing before the replica comes
// back sees the whole run). The channel starts with the current value,
// never blocks the repair (a slow reader skips values, keeping the
// latest), and closes after the attempt's final value. An attempt that
// already ended delivers its final value at once. cancel stops watching.
func (u *Upstairs) SubscribeLiveRepair(replica int, buffer int) (<-chan reconcile.Progress, func()) {
	if replica < 0 || replica >= engine.ReplicaCount {
		ch := make(chan reconcile.Progress)
		close(ch)
		return ch, func() {}
	}
	u.mu.Lock()
	slot := &u.live[replica]
	if slot.tracker == nil || slot.claimed && !slot.running && slot.tracker.Status().Phase.Terminal() && u.eng.State(replica) != engine.ReplicaActive {
		// Nothing runs and the replica still needs repair: watch the
		// next attempt.
		slot.tracker, slot.claimed = reconcile.NewTracker(nil), false
	}
	t := slot.tracker
	u.mu.Unlock()
	return t.Subscribe(buffer)
}

// ActivationProgress returns the progress of activation (negotiating
// until Activate gets there; done or error once it returned).
func (u *Upstairs) ActivationProgress() reconcile.Progress { return u.actTracker.Status() }

// SubscribeActivation watches the activation from any moment after New:
// the channel starts with the current value, never blocks the activation
// (a slow reader skips values, keeping the latest) and closes after the
// final value (done or error). cancel stops watching.
func (u *Upstairs) SubscribeActivation(buffer int) (<-chan reconcile.Progress, func()) {
	return u.actTracker.Subscribe(buffer)
}
