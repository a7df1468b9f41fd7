package engine

import (
	"slices"

	"tern/volume/ids"
	"tern/volume/internal/fixes"
	"tern/volume/wire"
)

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
	if fixes.Undone(fixes.RepairLostWrites) {
		lostWrites = false
	}
	switch st := e.replicas[r].state; {
	case st == ReplicaOffline && !lostWrites:
		return RejoinReplay
	case st != ReplicaOffline && st != ReplicaRepairing:
		return RejoinNone
	}
	if e.AnyActive() || fixes.Undone(fixes.HoldWithoutSource) {
		// r itself is not Active (it is Offline or Repairing).
		return RejoinRepair
	}
	return RejoinHold
}

// SessionActivated is told that replica r's new session activated while
// the volume runs (not during the activation, which plans its own
// repair), with the extent versions the replica reported and its
// downstairs' ActivateAck.LostWrites. It records the flush of generation
// gen those versions show applied (FlushedOn), decides (Rejoin) and acts:
// a replay is queued; a replica to repair is Repairing, an Offline one
// straight from Offline (were it Faulted first, the jobs it skips would
// fail before the repair counts for them), and its session takes IO as
// the live-repair walk routes it. The driver then starts the live repair
// of a Repairing replica, or holds the session on RejoinHold. Both the
// upstairs and the simulator call it, so neither repeats the sequence.
func (e *Engine) SessionActivated(r int, gen ids.Generation, versions []wire.ExtentVersion, lostWrites bool) RejoinDecision {
	if e.replicas[r].state == ReplicaOffline {
		e.FlushedOn(r, FlushedAt(versions, gen))
	}
	d := e.Rejoin(r, lostWrites)
	switch d {
	case RejoinHold:
		return d
	case RejoinRepair:
		if e.replicas[r].state == ReplicaOffline {
			e.RepairStarted(r)
		}
	}
	e.Connected(r)
	return d
}

// FlushedAt returns the greatest flush number of generation gen stamped
// on any extent in versions (0 if none): that flush has run on the
// replica that reported them.
func FlushedAt(versions []wire.ExtentVersion, gen ids.Generation) uint64 {
	var f uint64
	for _, v := range versions {
		if v.Gen == gen {
			f = max(f, v.Flush)
		}
	}
	return f
}

// LiveRepairSource picks the Active replica to live-repair r from: the
// lowest numbered, passing over avoid (the replica that served bad data to
// r's previous attempt, or -1) when another Active one can serve; -1 when
// none is Active. A silently damaged block on one source then cannot
// stall the repair forever.
func (e *Engine) LiveRepairSource(r, avoid int) int {
	if fixes.Undone(fixes.AvoidBadLiveSource) {
		avoid = -1
	}
	src := -1
	for s := range e.replicas {
		if s == r || e.replicas[s].state != ReplicaActive {
			continue
		}
		if src < 0 || src == avoid {
			src = s
		}
	}
	return src
}

// Behind reports whether replica r, held for a restart reconciliation,
// missed jobs its peers took (it was Faulted or Repairing, not Offline,
// when it was held): reconcile.ReplicaVersions.Behind, so it is a source
// only when every present replica is behind.
func (e *Engine) Behind(r int) bool { return e.replicas[r].state != ReplicaOffline }

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
