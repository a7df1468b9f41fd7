package upstairs

import (
	"time"

	"tern/volume/ids"
	"tern/volume/reconcile"
	"tern/volume/upstairs/engine"
	"tern/volume/wire"
)

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

// StatusChanged returns a channel closed at the end of the upstairs' next
// step: a reply applied, a job submitted, sent or retired, a replica's
// state changed, IO stopped. Take it, read Status, and wait on it if
// Status does not show what you wait for yet. (A replica's LastError is
// set between sessions, outside a step.) Until someone asks, no channel
// is made, so the IO path pays nothing for it.
func (u *Upstairs) StatusChanged() <-chan struct{} {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.stepCh == nil {
		u.stepCh = make(chan struct{})
	}
	return u.stepCh
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
