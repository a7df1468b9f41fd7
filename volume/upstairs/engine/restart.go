package engine

import "slices"

// Restart reconciliation in the engine. A replica that rejoins after a
// crash which may have lost writes it acknowledged but had not flushed
// (ActivateAck.LostWrites) cannot be replayed: the engine retired those
// writes once every replica acknowledged them, so its backlog does not
// hold them. It is live-repaired from an Active peer when one exists;
// when none does (every replica restarted), the driver holds the
// rejoining sessions, reconciles the held replicas with each other as at
// activation (reconcile.PlanRestart) while their IO waits in the
// backlogs, and then calls restarted: every live write and flush is
// replayed to each of them, so they end with the same blocks and no live
// job is lost. A write a later one overwrote on every replica (it retired)
// is not replayed: it would put its older data back over the newer; nor
// is one an acknowledged flush covers (the reconciled blocks hold it).

// RejoinDecision is what becomes of a replica whose new session activated
// while the volume runs.
type RejoinDecision uint8

const (
	// RejoinNone: nothing to decide (not running, or the replica is
	// neither Offline nor Repairing).
	RejoinNone RejoinDecision = iota
	// RejoinReplay: an Offline replica with its store intact; connected
	// replays its backlog.
	RejoinReplay
	// RejoinRepair: the replica needs repair (it may have lost writes,
	// or it is Repairing) and an Active peer can be its source: an
	// Offline one is faulted, then live repair runs.
	RejoinRepair
	// RejoinHold: it needs repair and no peer is Active: its session is
	// held for a restart reconciliation.
	RejoinHold
)

var rejoinNames = [...]string{
	RejoinNone:   "none",
	RejoinReplay: "replay",
	RejoinRepair: "repair",
	RejoinHold:   "hold",
}

func (k RejoinDecision) String() string { return rejoinNames[k] }

// Rejoin decides what becomes of replica r, whose new session activated;
// lostWrites is what its downstairs said (ActivateAck.LostWrites).
func (e *Engine) Rejoin(r int, lostWrites bool) RejoinDecision {
	if !e.running {
		return RejoinNone
	}
	switch st := e.replicas[r].state; {
	case st == ReplicaOffline && !lostWrites:
		return RejoinReplay
	case st != ReplicaOffline && st != ReplicaRepairing:
		return RejoinNone
	}
	for s := range e.replicas {
		if s != r && e.replicas[s].state == ReplicaActive {
			return RejoinRepair
		}
	}
	return RejoinHold
}

// AnyActive reports whether a replica is Active.
func (e *Engine) AnyActive() bool {
	for r := range e.replicas {
		if e.replicas[r].state == ReplicaActive {
			return true
		}
	}
	return false
}

// Restarted ends a restart reconciliation: the replicas in part hold the
// same blocks, stamped with flush numbers below nextFlush. Each is sent
// every live write and flush again, in ID order (its backlog included:
// what it acknowledged before the crash may be gone, and the
// reconciliation's source may have lost what it had not), and is Active
// once that is queued; the others are faulted (live repair brings them
// back). Live flushes are renumbered from nextFlush in ID order, so no
// replica stamps an extent with a number it may already carry with other
// blocks, and those not yet acknowledged fail with ErrRestarted: a write
// they cover may be lost. Torn writes that no participant still owes are
// left to their rewrites.
func (e *Engine) Restarted(part [ReplicaCount]bool, nextFlush uint64) {
	if !e.running {
		return
	}
	e.nextFlush = max(e.nextFlush, nextFlush)
	for _, j := range slices.Clone(e.order) {
		if j.Kind != KindFlush || e.jobs[j.ID] != j {
			continue
		}
		j.FlushNumber = e.nextFlush
		e.nextFlush++
		// A write it covers may be gone: one every replica had
		// acknowledged (so retired) and the reconciliation's source lost.
		e.complete(j, ErrRestarted)
	}
	for r := range e.replicas {
		if part[r] && e.replicas[r].state == ReplicaFaulted {
			// Faulted while held (its session failed a job, say): the
			// replay brings what it skipped.
			e.transition(r, EventRepairStart)
		}
	}
	for r := range e.replicas {
		if part[r] {
			e.replayAll(r)
		}
	}
	for r := range e.replicas {
		if !part[r] {
			e.Fault(r)
		}
	}
	for r := range e.replicas {
		if !part[r] {
			continue
		}
		switch e.replicas[r].state {
		case ReplicaRepairing:
			e.transition(r, EventRepairDone)
		default:
			e.transition(r, EventConnected)
		}
		e.emit(Action{Kind: ActWake, Replica: r})
	}
	for _, j := range e.order {
		if j.parked && e.jobs[j.ID] == j {
			e.routeRead(j)
		}
	}
	// Rerouting completes no job that retires another here, but progress
	// settles what the faults left.
	for _, j := range slices.Clone(e.order) {
		e.progress(j)
	}
}

// replayAll queues every live write and flush to replica r again, in ID
// order, each depending on the earlier ones it conflicts with (what r
// acknowledged in an earlier session is unknown to its downstairs now).
func (e *Engine) replayAll(r int) {
	rc := &e.replicas[r]
	rc.queue.clear()
	var replayed []*Job
	for _, j := range e.order {
		if j.Kind == KindRead || j.sending[r] {
			continue
		}
		if j.ID < e.flushedThrough {
			// Durable, so the reconciled blocks hold it (or newer data):
			// replaying it could only, if cut short (a fence), put its
			// older data back over a newer write.
			if j.slot[r].pending() {
				e.settle(j, r, slotDone)
				j.done++
			}
			continue
		}
		if j.superseded || j.torn && !j.slot[r].pending() {
			continue
		}
		switch s := j.slot[r]; {
		case s == slotDone:
			j.done--
			fallthrough
		case !s.pending():
			rc.owedJobs++
			rc.owedBytes += j.Bytes
		}
		j.slot[r] = slotQueued
		deps := j.deps[r][:0]
		for _, k := range replayed {
			if j.conflicts(k) {
				deps = append(deps, k.ID)
			}
		}
		j.deps[r] = deps
		rc.queue.insert(j)
		replayed = append(replayed, j)
	}
}
