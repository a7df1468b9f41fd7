package engine

import (
	"slices"

	"tern/volume/internal/fixes"
	"tern/volume/wire"
)

// ReadOutcome is what the driver found in a read reply.
type ReadOutcome uint8

const (
	// ReadGood: every block matched the hash the replica returned.
	ReadGood ReadOutcome = iota + 1
	// ReadBadData: a block failed verification (or the replica reported a
	// corrupt block); the replica's copy needs fixing.
	ReadBadData
	// ReadFailed: the replica could not serve the read.
	ReadFailed
)

// Done records that replica r applied write or flush id. Jobs that id had
// to follow on r are necessarily applied too, even if their own replies were
// lost with the connection; marking them keeps a replay from running an old
// write over a newer one.
func (e *Engine) Done(r int, id wire.JobID) {
	j, ok := e.jobs[id]
	if !ok || j.Kind == KindRead || !j.slot[r].pending() {
		return
	}
	e.markDone(j, r)
	for i := 0; i < len(j.deps[r]); i++ {
		if k, ok := e.jobs[j.deps[r][i]]; ok && k.Kind != KindRead && k.slot[r] == slotSent {
			e.Done(r, k.ID)
		}
	}
	if j.Kind == KindFlush && e.replicas[r].state == ReplicaActive {
		e.creditRepaired(r, j)
	}
	e.progress(j)
}

// creditRepaired counts Active replica r as done for the earlier writes
// and flushes it was never sent or had skipped, now that it made flush f
// durable. r can have missed a job only while Faulted or Repairing (an
// Offline replica keeps its backlog), so it is Active again through a
// repair whose copy read each extent from a source after every write
// submitted before it: r holds those writes' data, and f, which follows
// everything, made it durable. Without the credit such a job counts only
// the replicas it was sent to, and when one of them dies before answering
// it waits for that one (or fails) although two Active replicas hold it.
func (e *Engine) creditRepaired(r int, f *Job) {
	// Completing a job can retire others: walk a snapshot.
	for _, k := range slices.Clone(e.order) {
		if k.ID >= f.ID {
			break
		}
		if e.jobs[k.ID] != k || k.Kind == KindRead || k.completed || k.torn {
			continue
		}
		if s := k.slot[r]; s == slotNone || s == slotSkipped {
			e.markDone(k, r)
			e.progress(k)
		}
	}
}

func (e *Engine) markDone(j *Job, r int) {
	e.settle(j, r, slotDone)
	j.done++
}

// settle ends j's pending slot on r with state s.
func (e *Engine) settle(j *Job, r int, s slotState) {
	if j.slot[r].pending() {
		rc := &e.replicas[r]
		rc.owedJobs--
		rc.owedBytes -= j.Bytes
	}
	j.slot[r] = s
}

// Rejected records that r refused write id because its data did not match
// the hashes. If r was sent the data from the caller's buffer, the caller
// changed it in flight: the write is torn and is rewritten to every replica
// from a private copy, so all replicas end with the same bytes. A mismatch
// of private data is the replica's fault.
func (e *Engine) Rejected(r int, id wire.JobID) {
	j, ok := e.jobs[id]
	if !ok || !j.slot[r].pending() {
		return
	}
	if j.Kind != KindWrite || !j.fromCaller[r] {
		e.Fault(r)
		return
	}
	e.settle(j, r, slotFailed)
	j.torn = true
	if !j.callerMem && !j.privatizing && j.child == 0 {
		e.spawnRewrite(j)
	}
	e.progress(j)
}

// spawnRewrite queues a rewrite of torn write j from its private copy to
// every replica taking IO, ordered after everything submitted before it.
func (e *Engine) spawnRewrite(j *Job) wire.JobID {
	if !e.running || e.takers() == 0 {
		return 0
	}
	c := e.newJob(KindWrite, j.First, j.Count, j.Bytes)
	id := c.ID
	c.parent, j.child = j.ID, id
	e.emit(Action{Kind: ActRewrite, ID: id, Parent: j.ID})
	e.queueAll(c)
	return id
}

// Failed records that r could not run write or flush id: the replica is
// faulted, as it no longer holds what its peers hold.
func (e *Engine) Failed(r int, id wire.JobID) {
	if j, ok := e.jobs[id]; ok && j.slot[r].pending() {
		e.Fault(r)
	}
}

// ReadBegin is called before the driver decodes read id's data from r. It
// returns false when the data must be discarded instead of landing in the
// caller's buffer (the caller gave up, or the job moved on).
func (e *Engine) ReadBegin(r int, id wire.JobID) bool {
	j, ok := e.jobs[id]
	if !ok || j.Kind != KindRead || j.slot[r] != slotSent || j.abandoned || j.completed {
		return false
	}
	j.slot[r] = slotReceiving
	return true
}

// ReadResult records the outcome of read id on r. A read whose data failed
// verification is tried on another replica; once one serves it, the bad
// replicas are offered to the driver for repair.
func (e *Engine) ReadResult(r int, id wire.JobID, out ReadOutcome) {
	j, ok := e.jobs[id]
	if !ok || j.Kind != KindRead || !j.slot[r].pending() {
		return
	}
	if out == ReadGood {
		e.settle(j, r, slotDone)
		j.done++
	} else {
		e.settle(j, r, slotFailed)
		j.readTried[r] = true
		j.readBad[r] = out == ReadBadData
	}
	switch {
	case j.completed || j.abandoned:
	case out == ReadGood:
		for x := range j.readBad {
			if j.readBad[x] {
				e.emit(Action{Kind: ActRepairRead, ID: j.ID, Replica: x})
			}
		}
		e.complete(j, nil)
	default:
		e.routeRead(j)
	}
	e.progress(j)
}

// Privatized records that the driver copied write id's data out of the
// caller's buffer; same reports whether the copy still has the hashes the
// replicas were sent. If not, or if a replica already rejected the data, the
// write is torn and a rewrite from the copy is queued (actRewrite).
func (e *Engine) Privatized(id wire.JobID, same bool) {
	j, ok := e.jobs[id]
	if !ok || !j.privatizing {
		return
	}
	j.privatizing, j.callerMem = false, false
	// Replicas that held the job back while it was copied send the copy.
	for r := range j.slot {
		if j.slot[r] == slotQueued {
			e.emit(Action{Kind: ActWake, Replica: r})
		}
	}
	if !same {
		j.torn = true
	}
	if j.torn && j.child == 0 {
		e.spawnRewrite(j)
	}
	e.progress(j)
}

// Abandon records that the caller of id gave up. The caller is released
// (actComplete with errAbandoned) as soon as no replica touches its buffer;
// the job itself runs on so the replicas stay consistent.
func (e *Engine) Abandon(id wire.JobID) {
	j, ok := e.jobs[id]
	if !ok || j.completed {
		return
	}
	j.abandoned = true
	if j.Kind == KindRead {
		j.parked = false
		for r := range j.slot {
			if j.slot[r] == slotQueued {
				e.settle(j, r, slotSkipped)
			}
		}
	}
	e.progress(j)
}

// FlushedOn records that replica r's extents show flush number flush of
// this activation applied (a reconnecting replica reports its extent
// versions): that flush, and so every job it followed on r, is done
// there even if the replies were lost with the connection. Without this,
// a replay re-sends writes r applied before flushes it also applied; a
// replay cut short (a fence, a disconnect) then leaves r with older data
// than its flushed state, dirty, which reconciliation prefers.
func (e *Engine) FlushedOn(r int, flush uint64) {
	if fixes.Undone(fixes.FlushedOnRejoin) {
		return
	}
	var best *Job
	for _, j := range e.order {
		if j.Kind == KindFlush && j.FlushNumber <= flush && j.slot[r].pending() {
			best = j
		}
	}
	if best != nil && best.slot[r] == slotSent {
		e.Done(r, best.ID)
	}
}

// Connected records that replica r has a new activated session. An Offline
// replica gets its whole backlog requeued in ID order for replay.
func (e *Engine) Connected(r int) {
	rc := &e.replicas[r]
	prev := rc.state
	if !e.transition(r, EventConnected) {
		return
	}
	if prev == ReplicaOffline {
		rc.queue.clear()
		for _, j := range e.order {
			if j.slot[r].pending() {
				j.slot[r] = slotQueued
				rc.queue.insert(j)
			}
		}
		if rc.queue.len() > 0 {
			e.emit(Action{Kind: ActWake, Replica: r})
		}
	}
	for _, j := range slices.Clone(e.order) {
		if j.parked && e.jobs[j.ID] == j {
			e.routeRead(j)
		}
	}
}

// Disconnected records that replica r's connection is gone, with no send
// or receive of its driver still running. Writes and flushes in flight are
// kept for replay; reads move to another replica.
func (e *Engine) Disconnected(r int) {
	if !e.transition(r, EventDisconnected) {
		return
	}
	e.requeueReads(r)
	e.checkBacklogs()
}

// requeueReads moves reads pending on r elsewhere.
func (e *Engine) requeueReads(r int) {
	// Completing a job can retire others: walk a snapshot.
	for _, j := range slices.Clone(e.order) {
		if j.Kind == KindRead && j.slot[r].pending() && e.jobs[j.ID] == j {
			e.settle(j, r, slotNone)
			if !j.completed && !j.abandoned {
				e.routeRead(j)
			}
			e.progress(j)
		}
	}
}

// Fault marks replica r as needing repair: it gets no more IO, and what it
// owes is skipped.
func (e *Engine) Fault(r int) { e.transition(r, EventFault) }

// RepairStarted and repairDone are the seam for the repair engine: a
// Faulted replica (or an Offline one that may have lost writes, so is
// repaired rather than replayed) moves to Repairing, and after repair to
// Active, taking IO again from then on.
func (e *Engine) RepairStarted(r int) bool { return e.transition(r, EventRepairStart) }

func (e *Engine) RepairDone(r int) bool { return e.transition(r, EventRepairDone) }

// checkBacklogs faults Offline replicas that owe more than the backlog
// bounds, while a replica is Active: jobs can then retire without them.
// With none Active (every replica away, or held for a restart
// reconciliation) faulting one frees nothing, as the others owe the same
// jobs; the in-flight bound holds callers back instead (backpressure).
func (e *Engine) checkBacklogs() {
	if !e.AnyActive() {
		return
	}
	for r := range e.replicas {
		rc := &e.replicas[r]
		if rc.state == ReplicaOffline && (rc.owedJobs > e.limits.BacklogJobs || rc.owedBytes > e.limits.BacklogBytes) {
			e.transition(r, EventOverflow)
		}
	}
}

// transition applies ev to replica r and its consequences; it reports
// whether the state changed.
func (e *Engine) transition(r int, ev ReplicaEvent) bool {
	rc := &e.replicas[r]
	next := nextReplicaState(rc.state, ev)
	if next == rc.state {
		return false
	}
	prev := rc.state
	hadActive := e.AnyActive()
	rc.state = next
	e.emit(Action{Kind: ActState, Replica: r, State: next, Event: ev})
	switch {
	case !e.running:
	case !e.AnyActive():
		e.allAway = true
	case e.replicas[0].state == ReplicaActive && e.replicas[1].state == ReplicaActive && e.replicas[2].state == ReplicaActive:
		e.allAway = false
	}
	if prev == ReplicaRepairing && next != ReplicaActive || !hadActive && next == ReplicaActive {
		// Jobs that waited for the repair, or for any replica while
		// none was Active (possible), may fail now.
		defer func() {
			for _, j := range slices.Clone(e.order) {
				e.progress(j)
			}
		}()
	}
	if !next.takesIO() {
		// Skip what r owes, except requests its driver is busy with; the
		// driver reports those (sent, readResult) and they settle then.
		rc.queue.clear()
		// Completing a job can retire others: walk a snapshot.
		for _, j := range slices.Clone(e.order) {
			if e.jobs[j.ID] != j {
				continue
			}
			if s := j.slot[r]; s == slotQueued || s == slotSent && !j.sending[r] {
				e.settle(j, r, slotSkipped)
				if j.Kind == KindRead && !j.completed && !j.abandoned && e.running {
					e.routeRead(j)
				}
				e.progress(j)
			}
		}
		// Parked reads may have lost their last hope.
		for _, j := range slices.Clone(e.order) {
			if j.parked && e.jobs[j.ID] == j && e.running {
				e.routeRead(j)
				e.progress(j)
			}
		}
	}
	return true
}

// possible counts replicas that applied write or flush j or may still:
// it is pending there, or the replica is under repair or back from one,
// which brings what it skipped (creditRepaired counts it at the
// replica's next flush once Active; the driver flushes after every
// repair). So a job a replica skipped while it was repaired does not
// fail when a peer drops meanwhile; it waits for the repair.
func (e *Engine) possible(j *Job) int {
	if e.allAway {
		// Every replica went away: whichever come back are replayed,
		// reconciled with each other and replayed every live job
		// (Engine.Restarted), or repaired from the first one back and
		// credited. The job waits for them.
		n := 0
		for r := range e.replicas {
			if e.replicas[r].state != ReplicaStopped {
				n++
			}
		}
		return n
	}
	n := 0
	for r, x := range j.slot {
		st := e.replicas[r].state
		credit := (st == ReplicaRepairing || st == ReplicaActive) && (x == slotSkipped || x == slotNone)
		if x == slotDone || x.pending() || credit {
			n++
		}
	}
	return n
}

// failErr is the error of a job that can no longer reach quorum.
func (e *Engine) failErr() error {
	if e.stopErr != nil {
		return e.stopErr
	}
	return ErrNotEnoughReplicas
}

// progress moves j forward after any change: completes its caller when
// the outcome is known and its buffer is free, asks for a private copy of a
// write's data when replicas still need it after the caller leaves, and
// retires j when nothing refers to it any more.
func (e *Engine) progress(j *Job) {
	if e.jobs[j.ID] != j {
		return
	}
	// Busy slots of replicas that stopped taking IO settle here once the
	// driver is done with them; a read among them goes to a peer (the
	// replica left while its request was being written, so transition
	// could not move it then).
	for r := range j.slot {
		if j.slot[r] == slotSent && !j.sending[r] && !e.replicas[r].state.takesIO() {
			e.settle(j, r, slotSkipped)
			if j.Kind == KindRead && !j.completed && !j.abandoned && e.running {
				e.routeRead(j)
			}
		}
	}
	switch j.Kind {
	case KindWrite:
		e.progressWrite(j)
	case KindFlush:
		if !j.completed {
			switch {
			case j.abandoned:
				e.complete(j, ErrAbandoned)
			case int(j.done) >= Quorum:
				e.complete(j, nil)
			case e.possible(j) < Quorum || e.stopErr != nil:
				e.complete(j, e.failErr())
			}
		}
	case KindRead:
		if !j.completed && !j.anySlot(slotReceiving) {
			switch {
			case j.abandoned:
				e.complete(j, ErrAbandoned)
			case e.stopErr != nil:
				e.complete(j, e.stopErr)
			}
		}
	}
	e.maybeRetire(j)
}

func (e *Engine) progressWrite(j *Job) {
	if j.privatizing {
		return
	}
	if j.callerMem {
		if j.anySending() {
			return
		}
		settled := j.torn || j.abandoned || int(j.done) >= Quorum || e.possible(j) < Quorum || e.stopErr != nil
		if !settled {
			return
		}
		if j.anyPending() || j.torn && e.stopErr == nil {
			j.privatizing = true
			e.emit(Action{Kind: ActPrivatize, ID: j.ID})
			return
		}
		j.callerMem = false
	}
	if j.completed {
		return
	}
	switch {
	case j.abandoned:
		e.complete(j, ErrAbandoned)
	case e.stopErr != nil:
		e.complete(j, e.stopErr)
	case j.torn:
		// The rewrite completes it; without one it cannot succeed.
		if _, ok := e.jobs[j.child]; !ok {
			e.complete(j, e.failErr())
		}
	case int(j.done) >= Quorum:
		e.complete(j, nil)
	case e.possible(j) < Quorum:
		e.complete(j, ErrNotEnoughReplicas)
	}
}

// complete settles j's outcome: its caller is told, and a rewrite passes
// its outcome to the torn write it stands for.
func (e *Engine) complete(j *Job, err error) {
	if j.completed {
		return
	}
	j.completed = true
	if j.Kind == KindFlush && err == nil {
		e.flushedThrough = max(e.flushedThrough, j.ID)
	}
	if j.hasCaller {
		e.emit(Action{Kind: ActComplete, ID: j.ID, Err: err})
	}
	if p, ok := e.jobs[j.parent]; ok && j.parent != 0 && p.child == j.ID {
		p.child = 0
		if !p.completed {
			e.complete(p, err)
		}
		e.maybeRetire(p)
	}
}

func (e *Engine) maybeRetire(j *Job) {
	if !j.completed || j.privatizing || j.anyPending() || j.anySending() {
		return
	}
	e.retire(j)
}

func (e *Engine) retire(j *Job) {
	if e.jobs[j.ID] != j {
		return
	}
	delete(e.jobs, j.ID)
	if i, ok := slices.BinarySearchFunc(e.order, j.ID, func(k *Job, id wire.JobID) int {
		return compareIDs(k.ID, id)
	}); ok {
		if j.Kind == KindWrite {
			// Jobs mostly retire in order, so few older ones are live.
			for _, k := range e.order[:i] {
				if k.Kind == KindWrite && k.overlaps(j) {
					k.superseded = true
				}
			}
		}
		e.order = slices.Delete(e.order, i, i+1)
	}
	e.liveJobs--
	e.liveBytes -= j.Bytes
	e.emit(Action{Kind: ActRetire, ID: j.ID})
	j.reset()
	e.free = append(e.free, j)
}

func compareIDs(a, b wire.JobID) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
