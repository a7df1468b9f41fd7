package upstairs

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"

	"tern/volume/ids"
	"tern/volume/upstairs/engine"
	"tern/volume/wire"
)

// negotiate says Hello, compares the region, activates with the upstairs'
// generation and reports the session to the upstairs (Activate's
// bookkeeping the first time, replay afterwards).
func (r *replica) negotiate(ctx context.Context, enc *wire.Encoder, dec replyReader) error {
	u := r.u
	sessionID := uuid.New()
	hello := &wire.Hello{
		Versions:   wire.SupportedVersions,
		RegionUUID: u.cfg.Region.UUID,
		UpstairsID: u.cfg.UpstairsID,
		SessionID:  sessionID,
	}
	if err := enc.Encode(hello); err != nil {
		return fmt.Errorf("greeting replica %d: %w", r.id, err)
	}
	m, err := dec.Next()
	if err != nil {
		return fmt.Errorf("reading hello reply from replica %d: %w", r.id, err)
	}
	var region wire.RegionInfo
	switch m := m.(type) {
	case *wire.HelloReply:
		region = m.Region
		if err := checkGeometry(region); err != nil {
			return r.invalidRegion(fmt.Errorf("replica %d (%s) serves an invalid region: %w", r.id, r.target, err))
		}
	case *wire.Error:
		err := fmt.Errorf("replica %d (%s) refused hello: %w", r.id, r.target, m.Err())
		if m.Code == wire.CodeRegionMismatch {
			err = fmt.Errorf("%w: %w", ErrRegionMismatch, err)
		}
		return r.activationFailed(err)
	default:
		return fmt.Errorf("replica %d answered hello with %v", r.id, m.Type())
	}

	gen, err := r.await(ctx, region)
	if err != nil {
		return err
	}
	if err := enc.Encode(&wire.Activate{JobID: activateJobID, UpstairsID: u.cfg.UpstairsID, SessionID: sessionID, Gen: gen}); err != nil {
		return fmt.Errorf("activating replica %d: %w", r.id, err)
	}
	if m, err = dec.Next(); err != nil {
		return fmt.Errorf("reading activation reply from replica %d: %w", r.id, err)
	}
	lostWrites := false
	switch m := m.(type) {
	case *wire.ActivateAck:
		lostWrites = m.LostWrites
	case *wire.Fenced:
		err := fmt.Errorf("replica %d was activated by generation %d: %w", r.id, m.ByGen, ErrFenced)
		r.fenceOrFail(m.ByGen, err)
		return err
	case *wire.Error:
		err := fmt.Errorf("replica %d (%s) refused generation %d: %w", r.id, r.target, gen, m.Err())
		switch m.Code {
		case wire.CodeFenced:
			err = fmt.Errorf("%w: %w", ErrFenced, err)
			r.fenceOrFail(0, err)
		case wire.CodeGenTooLow:
			err = fmt.Errorf("%w: %w", ErrGenTooLow, err)
			r.refusedGen(err)
		}
		return err
	default:
		return fmt.Errorf("replica %d answered activation with %v", r.id, m.Type())
	}
	versions, err := r.extentVersions(enc, dec, region)
	if err != nil {
		return err
	}
	return r.activated(versions, lostWrites)
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

// extentVersions reads every extent's version.
func (r *replica) extentVersions(enc *wire.Encoder, dec replyReader, region wire.RegionInfo) ([]wire.ExtentVersion, error) {
	versions := make([]wire.ExtentVersion, 0, region.ExtentCount)
	for uint32(len(versions)) < region.ExtentCount {
		req := &wire.ExtentVersionsRequest{JobID: versionsJobID, First: ids.ExtentID(len(versions))}
		if err := enc.Encode(req); err != nil {
			return nil, fmt.Errorf("asking replica %d for extent versions: %w", r.id, err)
		}
		m, err := dec.Next()
		if err != nil {
			return nil, fmt.Errorf("reading extent versions from replica %d: %w", r.id, err)
		}
		ev, ok := m.(*wire.ExtentVersions)
		if !ok || ev.First != req.First || len(ev.Versions) == 0 {
			return nil, fmt.Errorf("replica %d answered extent versions with %v", r.id, m.Type())
		}
		versions = append(versions, ev.Versions...)
	}
	return versions[:region.ExtentCount], nil
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
