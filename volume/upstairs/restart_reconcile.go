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

// Restart reconciliation brings a running volume back when every replica
// restarted and at least one may have lost writes it acknowledged but had
// not flushed (ActivateAck.LostWrites): no replica is Active to
// live-repair the others from, and replaying a backlog over a replica that
// lost writes the engine already retired would leave it serving older
// data. The engine decides per rejoining session (Engine.Rejoin); a
// session it holds serves repair calls only, while guest IO waits in the
// Offline replicas' backlogs (bounded by Config.BacklogJobs and
// BacklogBytes, past which a replica faults as when it is away). One
// goroutine (runRestart) then:
//
//  1. waits until every replica's session is held, or until two are and
//     Config.ActivationQuorumWait has passed since (as Activate waits);
//     if a replica becomes Active meanwhile (an intact one replayed), the
//     held ones are faulted and live-repaired from it instead;
//  2. reads every extent's version from the held replicas and plans with
//     reconcile.PlanRestart at the upstairs' own generation, a dirty
//     source taking a flush number above every one issued;
//  3. repairs each planned extent as activation does
//     (repairPlannedExtent: stamp, mend torn blocks from donors, copy
//     the blocks that differ, stamp the destinations);
//  4. calls Engine.Restarted: every live write and flush is replayed to
//     each held replica, which is Active, and a flush follows; the
//     replicas left out are faulted and live-repaired.
//
// A failure (a held session ends, a copy fails) leaves the replicas held
// or faulted; the goroutine plans again once the held set changes.

// restartState is the bookkeeping of restart reconciliation; guarded by
// Upstairs.mu.
type restartState struct {
	// running: the runRestart goroutine runs.
	running bool
	// changed is closed (and replaced) when a session is held or a held
	// session ends.
	changed chan struct{}
	// tracker is the progress of the current or latest attempt.
	tracker *reconcile.Tracker
	// done counts restart reconciliations that brought the volume back.
	done int
}

// errRestartSuperseded: a replica became Active while the held ones were
// reconciled; they are live-repaired from it instead.
var errRestartSuperseded = errors.New("a replica became active during the restart reconciliation")

// holdLocked holds replica r's activated session for a restart
// reconciliation, starting its goroutine if none runs.
func (u *Upstairs) holdLocked(r int) {
	rep := u.replicas[r]
	u.log.Warn("replica restarted and may have lost unflushed writes, and no replica is active: holding it for a restart reconciliation",
		"replica", r, "target", rep.target, "state", u.eng.State(r))
	rep.held = true
	u.restartChangedLocked()
	if !u.restart.running {
		u.restart.running = true
		u.wg.Add(1)
		go u.runRestart()
	}
}

// unholdLocked notes that r's held session ended.
func (u *Upstairs) unholdLocked(r int) {
	if u.replicas[r].held {
		u.replicas[r].held = false
		u.restartChangedLocked()
	}
}

func (u *Upstairs) restartChangedLocked() {
	close(u.restart.changed)
	u.restart.changed = make(chan struct{})
}

// releaseHeldLocked hands the held replicas to live repair: a replica is
// Active to copy from.
func (u *Upstairs) releaseHeldLocked() {
	for r, rep := range u.replicas {
		if !rep.held {
			continue
		}
		rep.held = false
		u.log.Info("a replica is active again; live-repairing a held replica from it", "replica", r)
		u.faultForRepairLocked(r, fmt.Errorf("replica %d may have lost unflushed writes in a restart", r))
		u.startLiveRepairLocked(r, rep.epoch)
	}
	u.restartChangedLocked()
}

// faultForRepairLocked takes replica r, whose session serves, to
// Repairing (straight from Offline: were it Faulted first, the jobs it
// skips would fail before the repair counts for them) without ending its
// session.
func (u *Upstairs) faultForRepairLocked(r int, why error) {
	u.replicas[r].cause = why
	u.eng.RepairStarted(r)
	u.stepLocked()
	u.replicas[r].cause = nil
}

// runRestart is the restart reconciliation's goroutine; it ends once the
// volume is back (or a replica became Active), or the volume stops.
func (u *Upstairs) runRestart() {
	defer u.wg.Done()
	var quorumSince time.Time
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		u.mu.Lock()
		if !u.eng.Running() || u.ctx.Err() != nil {
			u.restart.running = false
			u.mu.Unlock()
			return
		}
		if u.eng.AnyActive() {
			u.releaseHeldLocked()
			u.restart.running = false
			u.stepLocked()
			u.finishLocked()
			return
		}
		var held [engine.ReplicaCount]bool
		var epochs [engine.ReplicaCount]uint64
		n := 0
		for r, rep := range u.replicas {
			if rep.held && rep.serving {
				held[r], epochs[r] = true, rep.epoch
				n++
			}
		}
		var wait <-chan time.Time
		ready := n == engine.ReplicaCount
		switch {
		case n < engine.Quorum:
			quorumSince = time.Time{}
		case quorumSince.IsZero():
			quorumSince = time.Now()
			fallthrough
		default:
			if left := u.cfg.ActivationQuorumWait - time.Since(quorumSince); left > 0 && !ready {
				timer.Reset(left)
				wait = timer.C
			} else {
				ready = true
			}
		}
		if !ready {
			changed, stateCh := u.restart.changed, u.stateCh
			u.mu.Unlock()
			select {
			case <-changed:
			case <-stateCh:
			case <-wait:
			case <-u.ctx.Done():
			}
			timer.Stop()
			continue
		}
		changed := u.restart.changed
		u.mu.Unlock()
		err := u.reconcileRestart(u.ctx, held, epochs)
		if err == nil {
			return
		}
		if errors.Is(err, errRestartSuperseded) {
			continue
		}
		u.log.Warn("restart reconciliation failed; planning again when the held replicas change", "err", err)
		timer.Reset(u.cfg.ReconnectMax)
		select {
		case <-changed:
		case <-timer.C:
		case <-u.ctx.Done():
		}
		timer.Stop()
	}
}

// reconcileRestart reconciles the held replicas (pinned to their session
// epochs) and returns the volume to IO; see the comment at the top of
// this file.
func (u *Upstairs) reconcileRestart(ctx context.Context, held [engine.ReplicaCount]bool, epochs [engine.ReplicaCount]uint64) (err error) {
	start := time.Now()
	defer u.repairRan(repairActivation, start)
	t := reconcile.NewTracker(nil)
	u.mu.Lock()
	u.restart.tracker = t
	flush := u.eng.NextFlush()
	u.mu.Unlock()
	defer func() {
		if err != nil {
			t.Fail(err)
		}
	}()
	_ = t.SetPhase(reconcile.PhaseComparing)
	var present []reconcile.ReplicaVersions
	for r := range engine.ReplicaCount {
		if !held[r] {
			continue
		}
		vs, err := u.allExtentVersions(ctx, r, epochs[r])
		if err != nil {
			return err
		}
		// A replica held Faulted or Repairing missed jobs its peers
		// took: it is no source while one of them is present.
		u.mu.Lock()
		behind := u.eng.Behind(r)
		u.mu.Unlock()
		present = append(present, reconcile.ReplicaVersions{Replica: reconcile.ReplicaID(r), Extents: vs, Behind: behind})
	}
	plan, err := reconcile.PlanRestart(u.gen, flush, present)
	if err != nil {
		return err
	}
	u.log.Warn("every replica restarted: reconciling them before IO resumes", "replicas", plan.Replicas,
		"extents", len(plan.Extents), "copies", plan.Copies)
	t.GrowTotals(uint64(len(plan.Extents)), 0)
	_ = t.SetPhase(reconcile.PhaseRepairing)
	versions := make(map[reconcile.ReplicaID][]reconcile.Version, len(present))
	for _, p := range present {
		versions[p.Replica] = p.Extents
	}
	for _, rep := range plan.Extents {
		if err := u.repairPlannedExtent(ctx, t, rep, versions, epochs, true); err != nil {
			return fmt.Errorf("restart reconciliation: repairing extent %d: %w", rep.Extent, err)
		}
		t.ExtentDone()
		u.extentRepaired(repairActivation)
	}

	u.mu.Lock()
	if u.eng.AnyActive() {
		u.mu.Unlock()
		return errRestartSuperseded
	}
	for r := range engine.ReplicaCount {
		if held[r] && (!u.replicas[r].held || u.replicas[r].epoch != epochs[r]) {
			u.mu.Unlock()
			return fmt.Errorf("restart reconciliation: replica %d: %w", r, ErrNoSession)
		}
	}
	for r, rep := range u.replicas {
		rep.held = false
		if !held[r] {
			rep.cause = fmt.Errorf("replica %d missed the restart reconciliation", r)
		}
	}
	u.eng.Restarted(held, plan.NextFlush())
	u.restart.running = false
	u.restart.done++
	u.restartChangedLocked()
	u.stepLocked()
	for _, rep := range u.replicas {
		rep.cause = nil
	}
	u.finishLocked()
	t.Finish()
	u.log.Info("restart reconciliation done; IO resumes", "replicas", plan.Replicas, "extents", len(plan.Extents),
		"seconds", time.Since(start).Seconds())
	if ferr := u.backgroundFlush(ctx); ferr != nil {
		u.log.Warn("flush after restart reconciliation failed", "err", ferr)
	}
	return nil
}

// allExtentVersions reads every extent's version from replica r's session
// epoch.
func (u *Upstairs) allExtentVersions(ctx context.Context, r int, epoch uint64) ([]reconcile.Version, error) {
	n := int(u.region.ExtentCount)
	out := make([]reconcile.Version, 0, n)
	for len(out) < n {
		first := ids.ExtentID(len(out))
		c, err := u.startCall(r, epoch, &wire.ExtentVersionsRequest{First: first, Count: uint32(n - len(out))}, nil)
		if err != nil {
			return nil, fmt.Errorf("asking replica %d for extent versions: %w", r, err)
		}
		m, err := u.waitCall(ctx, c)
		if err != nil {
			return nil, fmt.Errorf("asking replica %d for extent versions: %w", r, err)
		}
		v, ok := m.(*wire.ExtentVersions)
		if !ok || v.First != first || len(v.Versions) == 0 {
			return nil, fmt.Errorf("replica %d answered extent versions with %v: %w", r, m.Type(), errBadRepairReply)
		}
		for _, x := range v.Versions[:min(len(v.Versions), n-len(out))] {
			out = append(out, fromWireVersion(x))
		}
	}
	return out, nil
}
