package upstairs

import (
	"context"
	"errors"
	"fmt"

	"tern/volume/dsclient"
	"tern/volume/ids"
	"tern/volume/upstairs/engine"
	"tern/volume/wire"
)

// negotiate says Hello, compares the region, activates with the upstairs'
// generation and reports the session to the upstairs (Activate's
// bookkeeping the first time, replay afterwards). The steps are
// volume/dsclient's; what each failure means for the replica is decided
// here.
func (r *replica) negotiate(ctx context.Context, c *dsclient.Conn) error {
	u := r.u
	region, err := c.Hello(dsclient.HelloParams{RegionUUID: u.cfg.Region.UUID, UpstairsID: u.cfg.UpstairsID})
	if err != nil {
		if e := stepError(err); e != nil && e.Failure == dsclient.FailRefused {
			return r.activationFailed(r.setupError(err))
		}
		return r.setupError(err)
	}
	if err := checkGeometry(region); err != nil {
		return r.invalidRegion(fmt.Errorf("replica %d (%s) serves an invalid region: %w", r.id, r.target, err))
	}

	gen, err := r.await(ctx, region)
	if err != nil {
		return err
	}
	lostWrites, err := c.Activate(ctx, u.cfg.UpstairsID, gen)
	if err != nil {
		e, err := stepError(err), r.setupError(err)
		switch {
		case e == nil:
		case e.Failure == dsclient.FailFenced:
			r.fenceOrFail(e.ByGen, err)
		case e.Failure == dsclient.FailRefused && e.Code == wire.CodeFenced:
			r.fenceOrFail(0, err)
		case e.Failure == dsclient.FailRefused && e.Code == wire.CodeGenTooLow:
			r.refusedGen(err)
		}
		return err
	}
	versions, err := c.ExtentVersions(region.ExtentCount)
	if err != nil {
		return r.setupError(err)
	}
	return r.activated(versions, lostWrites)
}

// setupError words a failed step of the session's setup as the upstairs
// reports it: naming the replica (and its target where a refusal came
// from it) inside the sentence, with the volume error a refusal means
// first.
func (r *replica) setupError(stepErr error) error {
	e := stepError(stepErr)
	if e == nil {
		return stepErr
	}
	var err error
	switch e.Failure {
	case dsclient.FailSend:
		switch e.Step {
		case dsclient.StepStream:
			err = fmt.Errorf("opening session stream to replica %d: %w", r.id, e.Err)
		case dsclient.StepHello:
			err = fmt.Errorf("greeting replica %d: %w", r.id, e.Err)
		case dsclient.StepActivate:
			err = fmt.Errorf("activating replica %d: %w", r.id, e.Err)
		default:
			err = fmt.Errorf("asking replica %d for extent versions: %w", r.id, e.Err)
		}
	case dsclient.FailReceive:
		switch e.Step {
		case dsclient.StepHello:
			err = fmt.Errorf("reading hello reply from replica %d: %w", r.id, e.Err)
		case dsclient.StepActivate:
			err = fmt.Errorf("reading activation reply from replica %d: %w", r.id, e.Err)
		default:
			err = fmt.Errorf("reading extent versions from replica %d: %w", r.id, e.Err)
		}
	case dsclient.FailRefused:
		if e.Step == dsclient.StepHello {
			err = fmt.Errorf("replica %d (%s) refused hello: %w", r.id, r.target, e.Err)
		} else {
			err = fmt.Errorf("replica %d (%s) refused generation %d: %w", r.id, r.target, e.Gen, e.Err)
		}
	case dsclient.FailFenced:
		err = fmt.Errorf("replica %d was activated by generation %d: %w", r.id, e.ByGen, ErrFenced)
	default:
		err = fmt.Errorf("replica %d answered %v with %v", r.id, e.Step, e.Got)
	}
	if s := e.Sentinel(); s != nil {
		err = fmt.Errorf("%w: %w", s, err)
	}
	return err
}

// stepError is the failed step behind err, or nil.
func stepError(err error) *dsclient.Error {
	var e *dsclient.Error
	if errors.As(err, &e) {
		return e
	}
	return nil
}

// await reports the negotiated region and returns the generation to
// activate with once the upstairs lets this replica go ahead.
func (r *replica) await(ctx context.Context, region wire.RegionInfo) (ids.Generation, error) {
	u := r.u
	u.mu.Lock()
	a := u.act
	if a == nil {
		u.mu.Unlock()
		return 0, errSessionEnded
	}
	if !a.decided {
		a.region[r.id] = &region
		a.notifyLocked()
		proceed := a.proceed
		u.mu.Unlock()
		select {
		case <-proceed:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
		u.mu.Lock()
	}
	defer u.mu.Unlock()
	for a.region[r.id] == nil && !u.eng.Running() && u.eng.StopErr() == nil {
		// Activation went ahead without this replica and has not started
		// IO yet (it is reconciling): wait, then join by live repair.
		ch := a.changed
		u.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			u.mu.Lock()
			return 0, ctx.Err()
		}
		u.mu.Lock()
	}
	if d := regionDiff(u.region, region); d != "" {
		// A replica that comes back serving another region is not one
		// of ours any more.
		err := fmt.Errorf("replica %d (%s): %s: %w", r.id, r.target, d, ErrRegionMismatch)
		r.dropLocked(err, func() { u.eng.Fault(r.id) })
		return 0, err
	}
	st := u.eng.State(r.id)
	if st == engine.ReplicaFaulted && u.eng.Running() {
		// Reachable and serving our region: live repair takes it over
		// once this session is activated.
		u.eng.RepairStarted(r.id)
		u.stepLocked()
		st = u.eng.State(r.id)
	}
	if st == engine.ReplicaFaulted || st == engine.ReplicaStopped || a.region[r.id] == nil && st != engine.ReplicaRepairing {
		return 0, errSessionEnded
	}
	return u.gen, nil
}

// activated reports an activated session: to Activate during activation,
// to the engine on a reconnect, which decides (Engine.Rejoin): an intact
// Offline replica is replayed its backlog. One that needs repair — it may
// have lost writes (it crashed with unflushed writes, which the engine
// retired once every replica acknowledged them, so a replay cannot bring
// them back), or it is Repairing — is live-repaired from an Active peer,
// or, when no peer is Active (every replica restarted), held for a
// restart reconciliation (restart_reconcile.go).
func (r *replica) activated(versions []wire.ExtentVersion, lostWrites bool) error {
	u := r.u
	u.mu.Lock()
	a := u.act
	// The session serves calls from now on (serve sends them).
	r.serving = true
	r.epoch++
	if !u.eng.Running() && u.eng.StopErr() == nil {
		a.done[r.id] = true
		a.versions[r.id] = versions
		a.notifyLocked()
		// The session serves calls (activation repair) at once; the
		// engine's jobs flow once Activate starts IO.
		u.mu.Unlock()
		return nil
	}
	wasOffline := u.eng.State(r.id) == engine.ReplicaOffline
	switch u.eng.SessionActivated(r.id, u.gen, versions, lostWrites) {
	case engine.RejoinRepair:
		if wasOffline {
			// Straight to Repairing: the session stays.
			u.log.Warn("replica restarted and may have lost unflushed writes; repairing it instead of replaying", "replica", r.id, "target", r.target)
			r.cause = fmt.Errorf("replica %d restarted and may have lost unflushed writes", r.id)
		}
	case engine.RejoinHold:
		u.holdLocked(r.id)
		u.stepLocked()
		u.finishLocked()
		return nil
	}
	u.startLiveRepairLocked(r.id, r.epoch)
	u.stepLocked()
	r.cause = nil
	u.finishLocked()
	return nil
}

// activationFailed records err for Activate if it is still waiting.
func (r *replica) activationFailed(err error) error {
	u := r.u
	u.mu.Lock()
	defer u.mu.Unlock()
	if a := u.act; a != nil && !u.eng.Running() {
		a.err[r.id] = err
		a.notifyLocked()
	} else if errors.Is(err, ErrRegionMismatch) {
		r.dropLocked(err, func() { u.eng.Fault(r.id) })
	}
	return err
}

// refusedGen handles a downstairs refusing our generation: during
// activation the activation fails; on a reconnect the replica cannot rejoin
// this activation and is faulted (needs repair). If another upstairs took
// the region over, the other replicas' sessions fence us.
func (r *replica) refusedGen(err error) {
	u := r.u
	u.mu.Lock()
	if !u.eng.Running() {
		u.mu.Unlock()
		_ = r.activationFailed(err)
		return
	}
	u.log.Error("replica refused to rejoin the activation; it needs repair", "replica", r.id, "target", r.target, "err", err)
	r.dropLocked(err, func() { u.eng.Fault(r.id) })
	u.finishLocked()
}

// fenceOrFail fences the running upstairs, or fails the activation.
func (r *replica) fenceOrFail(byGen ids.Generation, err error) {
	u := r.u
	u.mu.Lock()
	running := u.eng.Running()
	u.mu.Unlock()
	if running {
		u.fence(r.id, byGen)
		return
	}
	_ = r.activationFailed(err)
}
