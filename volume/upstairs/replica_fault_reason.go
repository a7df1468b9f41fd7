package upstairs

import (
	"fmt"
	"time"

	"tern/volume/upstairs/engine"
)

// Why a replica is out of service. Status reports it as FaultReason,
// apart from lastErr: after a replica is dropped, each failed reconnect
// replaces lastErr, while the reason it was dropped is what an operator
// (and a test) needs to see until it serves again.

// stateChanged is called under u.mu when the engine moves this replica
// to st on ev: it keeps the fault reason and wakes the run goroutine.
func (r *replica) stateChanged(st engine.ReplicaState, ev engine.ReplicaEvent) {
	r.noteFaultLocked(st, ev)
	r.wakeUp()
}

// dropLocked tells the engine, with tell (u.eng.Fault, u.eng.Disconnected,
// ...), that this replica stops serving IO because of why, and applies
// the engine's actions; why becomes the fault reason if the engine moves
// the replica out of service.
func (r *replica) dropLocked(why error, tell func()) {
	r.cause = why
	tell()
	r.u.stepLocked()
	r.cause = nil
}

// noteFaultLocked keeps faultReason up to date with a state change: set
// when the replica leaves service (to Offline or Faulted, from r.cause
// or the engine's event), extended when it falls further (Offline to
// Faulted), cleared when it is Active again. Reconnect attempts in
// between do not touch it, so it still says why the replica was dropped
// when lastErr already says why it cannot come back.
func (r *replica) noteFaultLocked(st engine.ReplicaState, ev engine.ReplicaEvent) {
	switch st {
	case engine.ReplicaActive:
		r.faultReason, r.faultFirst, r.faultedAt = nil, nil, time.Time{}
		return
	case engine.ReplicaOffline, engine.ReplicaFaulted:
	default:
		return
	}
	why := r.cause
	if why == nil || ev == engine.EventOverflow {
		why = r.eventReasonLocked(ev)
	}
	if r.faultFirst == nil {
		r.faultFirst, r.faultedAt = why, time.Now()
	}
	r.faultReason = why
}

// eventReasonLocked describes a transition the engine decided by itself.
func (r *replica) eventReasonLocked(ev engine.ReplicaEvent) error {
	switch ev {
	case engine.EventOverflow:
		owedJobs, owedBytes := r.u.eng.Owed(r.id)
		limits := r.u.eng.Limits()
		return fmt.Errorf("replica %d owes %d jobs (%d bytes), more than the offline backlog allows (%d jobs, %d bytes)",
			r.id, owedJobs, owedBytes, limits.BacklogJobs, limits.BacklogBytes)
	case engine.EventDisconnected:
		return fmt.Errorf("replica %d: connection lost", r.id)
	}
	return fmt.Errorf("replica %d: %v", r.id, ev)
}

// faultReasonLocked is FaultReason of the replica's status.
func (r *replica) faultReasonLocked() string {
	switch {
	case r.faultReason == nil:
		return ""
	case r.faultFirst == nil || r.faultFirst == r.faultReason:
		return r.faultReason.Error()
	}
	return r.faultReason.Error() + "; first: " + r.faultFirst.Error()
}
