package engine

import (
	"tern/volume/ids"
	"tern/volume/reconcile"
	"tern/volume/wire"
)

// Live repair in the engine: a Repairing replica with a walk attached
// (replicaCore.live) receives guest writes as reconcile.LiveRepair routes
// them, extent by extent. Jobs never cross an extent (the driver splits
// IO at extent boundaries), so each write has one route:
//
//   - WriteSend (extent already repaired): queued and sent as usual.
//   - WriteAfterRepair (extent under repair): queued, but the replica's
//     queue is held at it until the extent's repair is done, so it reaches
//     the downstairs after the repair's writes and the copy cannot
//     overwrite it. Everything queued behind it waits too: jobs are sent
//     in ID order so dependencies always name earlier jobs.
//   - WriteSkip (extent not yet repaired): not queued; the copy brings
//     its data, since the repair of that extent reads the source after it.
//
// Reads and flushes never go to a Repairing replica: it serves no reads,
// and a flush would stamp extents not yet repaired with a version their
// peers carry with other data. The final flush after completion stamps
// what it was written since.

// SetExtentBlocks records the region geometry the routing needs.
func (e *Engine) SetExtentBlocks(n uint32) { e.extentBlocks = n }

// extentOf returns the extent job j touches (jobs do not cross extents).
func (e *Engine) extentOf(j *Job) ids.ExtentID {
	if e.extentBlocks == 0 {
		return 0
	}
	return ids.ExtentID(uint32(j.First) / e.extentBlocks)
}

// AttachLiveRepair starts routing guest writes to Repairing replica r by
// walk; detachLiveRepair stops it (the walk completed or was aborted).
func (e *Engine) AttachLiveRepair(r int, walk *reconcile.LiveRepair) {
	e.replicas[r].live = walk
}

func (e *Engine) DetachLiveRepair(r int, walk *reconcile.LiveRepair) {
	if e.replicas[r].live == walk {
		e.replicas[r].live = nil
	}
}

// receives reports whether job j is queued to replica r when submitted:
// every job for a replica taking IO, routed writes for one under repair.
func (e *Engine) receives(r int, j *Job) bool {
	rc := &e.replicas[r]
	if rc.state.takesIO() {
		return true
	}
	if rc.state != ReplicaRepairing || rc.live == nil || j.Kind != KindWrite {
		return false
	}
	return rc.live.RouteWrite(e.extentOf(j)) != reconcile.WriteSkip
}

// sendable reports whether replica r may be sent job j now.
func (e *Engine) sendable(r int, j *Job) bool {
	rc := &e.replicas[r]
	switch rc.state {
	case ReplicaActive:
		return true
	case ReplicaRepairing:
		return rc.live != nil && j.Kind == KindWrite &&
			rc.live.RouteWrite(e.extentOf(j)) == reconcile.WriteSend
	}
	return false
}

// peekNext returns the next job replica r may be sent, without taking it:
// nil when its queue is empty or held.
func (e *Engine) peekNext(r int) *Job {
	rc := &e.replicas[r]
	for {
		j, ok := rc.queue.peek()
		if !ok {
			return nil
		}
		if j.slot[r] != slotQueued {
			rc.queue.pop() // rerouted or skipped since it was queued
			continue
		}
		if !e.sendable(r, j) {
			return nil
		}
		return j
	}
}

// NextJobID returns the ID of the next job r may be sent, or 0.
func (e *Engine) NextJobID(r int) wire.JobID {
	if j := e.peekNext(r); j != nil {
		return j.ID
	}
	return 0
}
