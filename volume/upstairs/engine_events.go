package upstairs

import (
	"slices"

	"tern/volume/wire"
)

// readOutcome is what the driver found in a read reply.
type readOutcome uint8

const (
	// readGood: every block matched the hash the replica returned.
	readGood readOutcome = iota + 1
	// readBadData: a block failed verification (or the replica reported a
	// corrupt block); the replica's copy needs fixing.
	readBadData
	// readFailed: the replica could not serve the read.
	readFailed
)

// done records that replica r applied write or flush id. Jobs that id had
// to follow on r are necessarily applied too, even if their own replies were
// lost with the connection; marking them keeps a replay from running an old
// write over a newer one.
func (e *engine) done(r int, id wire.JobID) {
	j, ok := e.jobs[id]
	if !ok || j.kind == kindRead || !j.slot[r].pending() {
		return
	}
	e.markDone(j, r)
	for i := 0; i < len(j.deps[r]); i++ {
		if k, ok := e.jobs[j.deps[r][i]]; ok && k.kind != kindRead && k.slot[r] == slotSent {
			e.done(r, k.id)
		}
	}
	if j.kind == kindFlush && e.replicas[r].state == ReplicaActive {
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
func (e *engine) creditRepaired(r int, f *job) {
	// Completing a job can retire others: walk a snapshot.
	for _, k := range slices.Clone(e.order) {
		if k.id >= f.id {
			break
		}
		if e.jobs[k.id] != k || k.kind == kindRead || k.completed || k.torn {
			continue
		}
		if s := k.slot[r]; s == slotNone || s == slotSkipped {
			e.markDone(k, r)
			e.progress(k)
		}
	}
}

func (e *engine) markDone(j *job, r int) {
	e.settle(j, r, slotDone)
	j.done++
}

// settle ends j's pending slot on r with state s.
func (e *engine) settle(j *job, r int, s slotState) {
	if j.slot[r].pending() {
		rc := &e.replicas[r]
		rc.owedJobs--
		rc.owedBytes -= j.bytes
	}
	j.slot[r] = s
}

// rejected records that r refused write id because its data did not match
// the hashes. If r was sent the data from the caller's buffer, the caller
// changed it in flight: the write is torn and is rewritten to every replica
// from a private copy, so all replicas end with the same bytes. A mismatch
// of private data is the replica's fault.
func (e *engine) rejected(r int, id wire.JobID) {
	j, ok := e.jobs[id]
	if !ok || !j.slot[r].pending() {
		return
	}
	if j.kind != kindWrite || !j.fromCaller[r] {
		e.fault(r)
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
func (e *engine) spawnRewrite(j *job) wire.JobID {
	if !e.running || e.takers() == 0 {
		return 0
	}
	c := e.newJob(kindWrite, j.first, j.count, j.bytes)
	id := c.id
	c.parent, j.child = j.id, id
	e.emit(action{kind: actRewrite, id: id, parent: j.id})
	e.queueAll(c)
	return id
}

// failed records that r could not run write or flush id: the replica is
// faulted, as it no longer holds what its peers hold.
func (e *engine) failed(r int, id wire.JobID) {
	if j, ok := e.jobs[id]; ok && j.slot[r].pending() {
		e.fault(r)
	}
}

// readBegin is called before the driver decodes read id's data from r. It
// returns false when the data must be discarded instead of landing in the
// caller's buffer (the caller gave up, or the job moved on).
func (e *engine) readBegin(r int, id wire.JobID) bool {
	j, ok := e.jobs[id]
	if !ok || j.kind != kindRead || j.slot[r] != slotSent || j.abandoned || j.completed {
		return false
	}
	j.slot[r] = slotReceiving
	return true
}

// readResult records the outcome of read id on r. A read whose data failed
// verification is tried on another replica; once one serves it, the bad
// replicas are offered to the driver for repair.
func (e *engine) readResult(r int, id wire.JobID, out readOutcome) {
	j, ok := e.jobs[id]
	if !ok || j.kind != kindRead || !j.slot[r].pending() {
		return
	}
	if out == readGood {
		e.settle(j, r, slotDone)
		j.done++
	} else {
		e.settle(j, r, slotFailed)
		j.readTried[r] = true
		j.readBad[r] = out == readBadData
	}
	switch {
	case j.completed || j.abandoned:
	case out == readGood:
		for x := range j.readBad {
			if j.readBad[x] {
				e.emit(action{kind: actRepairRead, id: j.id, replica: x})
			}
		}
		e.complete(j, nil)
	default:
		e.routeRead(j)
	}
	e.progress(j)
}

// privatized records that the driver copied write id's data out of the
// caller's buffer; same reports whether the copy still has the hashes the
// replicas were sent. If not, or if a replica already rejected the data, the
// write is torn and a rewrite from the copy is queued (actRewrite).
func (e *engine) privatized(id wire.JobID, same bool) {
	j, ok := e.jobs[id]
	if !ok || !j.privatizing {
		return
	}
	j.privatizing, j.callerMem = false, false
	// Replicas that held the job back while it was copied send the copy.
	for r := range j.slot {
		if j.slot[r] == slotQueued {
			e.emit(action{kind: actWake, replica: r})
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

// abandon records that the caller of id gave up. The caller is released
// (actComplete with errAbandoned) as soon as no replica touches its buffer;
// the job itself runs on so the replicas stay consistent.
func (e *engine) abandon(id wire.JobID) {
	j, ok := e.jobs[id]
	if !ok || j.completed {
		return
	}
	j.abandoned = true
	if j.kind == kindRead {
		j.parked = false
		for r := range j.slot {
			if j.slot[r] == slotQueued {
				e.settle(j, r, slotSkipped)
			}
		}
	}
	e.progress(j)
}

// flushedOn records that replica r's extents show flush number flush of
// this activation applied (a reconnecting replica reports its extent
// versions): that flush, and so every job it followed on r, is done
// there even if the replies were lost with the connection. Without this,
// a replay re-sends writes r applied before flushes it also applied; a
// replay cut short (a fence, a disconnect) then leaves r with older data
// than its flushed state, dirty, which reconciliation prefers.
func (e *engine) flushedOn(r int, flush uint64) {
	var best *job
	for _, j := range e.order {
		if j.kind == kindFlush && j.flushNumber <= flush && j.slot[r].pending() {
			best = j
		}
	}
	if best != nil && best.slot[r] == slotSent {
		e.done(r, best.id)
	}
}

// connected records that replica r has a new activated session. An Offline
// replica gets its whole backlog requeued in ID order for replay.
func (e *engine) connected(r int) {
	rc := &e.replicas[r]
	prev := rc.state
	if !e.transition(r, evConnected) {
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
			e.emit(action{kind: actWake, replica: r})
		}
	}
	for _, j := range slices.Clone(e.order) {
		if j.parked && e.jobs[j.id] == j {
			e.routeRead(j)
		}
	}
}

// disconnected records that replica r's connection is gone, with no send
// or receive of its driver still running. Writes and flushes in flight are
// kept for replay; reads move to another replica.
func (e *engine) disconnected(r int) {
	if !e.transition(r, evDisconnected) {
		return
	}
	e.requeueReads(r)
	e.checkBacklogs()
}

// requeueReads moves reads pending on r elsewhere.
func (e *engine) requeueReads(r int) {
	// Completing a job can retire others: walk a snapshot.
	for _, j := range slices.Clone(e.order) {
		if j.kind == kindRead && j.slot[r].pending() && e.jobs[j.id] == j {
			e.settle(j, r, slotNone)
			if !j.completed && !j.abandoned {
				e.routeRead(j)
			}
			e.progress(j)
		}
	}
}

// fault marks replica r as needing repair: it gets no more IO, and what it
// owes is skipped.
func (e *engine) fault(r int) { e.transition(r, evFault) }

// repairStarted and repairDone are the seam for the repair engine: a
// Faulted replica (or an Offline one that may have lost writes, so is
// repaired rather than replayed) moves to Repairing, and after repair to
// Active, taking IO again from then on.
func (e *engine) repairStarted(r int) bool { return e.transition(r, evRepairStart) }

func (e *engine) repairDone(r int) bool { return e.transition(r, evRepairDone) }

// checkBacklogs faults Offline replicas that owe more than the backlog
// bounds, while a replica is Active: jobs can then retire without them.
// With none Active (every replica away, or held for a restart
// reconciliation) faulting one frees nothing, as the others owe the same
// jobs; the in-flight bound holds callers back instead (backpressure).
func (e *engine) checkBacklogs() {
	if !e.anyActive() {
		return
	}
	for r := range e.replicas {
		rc := &e.replicas[r]
		if rc.state == ReplicaOffline && (rc.owedJobs > e.limits.backlogJobs || rc.owedBytes > e.limits.backlogBytes) {
			e.transition(r, evOverflow)
		}
	}
}

// transition applies ev to replica r and its consequences; it reports
// whether the state changed.
func (e *engine) transition(r int, ev replicaEvent) bool {
	rc := &e.replicas[r]
	next := nextReplicaState(rc.state, ev)
	if next == rc.state {
		return false
	}
	prev := rc.state
	hadActive := e.anyActive()
	rc.state = next
	e.emit(action{kind: actState, replica: r, state: next, event: ev})
	switch {
	case !e.running:
	case !e.anyActive():
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
			if e.jobs[j.id] != j {
				continue
			}
			if s := j.slot[r]; s == slotQueued || s == slotSent && !j.sending[r] {
				e.settle(j, r, slotSkipped)
				if j.kind == kindRead && !j.completed && !j.abandoned && e.running {
					e.routeRead(j)
				}
				e.progress(j)
			}
		}
		// Parked reads may have lost their last hope.
		for _, j := range slices.Clone(e.order) {
			if j.parked && e.jobs[j.id] == j && e.running {
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
func (e *engine) possible(j *job) int {
	if e.allAway {
		// Every replica went away: whichever come back are replayed,
		// reconciled with each other and replayed every live job
		// (engine.restarted), or repaired from the first one back and
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
func (e *engine) failErr() error {
	if e.stopErr != nil {
		return e.stopErr
	}
	return ErrNotEnoughReplicas
}

// progress moves j forward after any change: completes its caller when
// the outcome is known and its buffer is free, asks for a private copy of a
// write's data when replicas still need it after the caller leaves, and
// retires j when nothing refers to it any more.
func (e *engine) progress(j *job) {
	if e.jobs[j.id] != j {
		return
	}
	// Busy slots of replicas that stopped taking IO settle here once the
	// driver is done with them.
	for r := range j.slot {
		if j.slot[r] == slotSent && !j.sending[r] && !e.replicas[r].state.takesIO() {
			e.settle(j, r, slotSkipped)
		}
	}
	switch j.kind {
	case kindWrite:
		e.progressWrite(j)
	case kindFlush:
		if !j.completed {
			switch {
			case j.abandoned:
				e.complete(j, errAbandoned)
			case int(j.done) >= quorum:
				e.complete(j, nil)
			case e.possible(j) < quorum || e.stopErr != nil:
				e.complete(j, e.failErr())
			}
		}
	case kindRead:
		if !j.completed && !j.anySlot(slotReceiving) {
			switch {
			case j.abandoned:
				e.complete(j, errAbandoned)
			case e.stopErr != nil:
				e.complete(j, e.stopErr)
			}
		}
	}
	e.maybeRetire(j)
}

func (e *engine) progressWrite(j *job) {
	if j.privatizing {
		return
	}
	if j.callerMem {
		if j.anySending() {
			return
		}
		settled := j.torn || j.abandoned || int(j.done) >= quorum || e.possible(j) < quorum || e.stopErr != nil
		if !settled {
			return
		}
		if j.anyPending() || j.torn && e.stopErr == nil {
			j.privatizing = true
			e.emit(action{kind: actPrivatize, id: j.id})
			return
		}
		j.callerMem = false
	}
	if j.completed {
		return
	}
	switch {
	case j.abandoned:
		e.complete(j, errAbandoned)
	case e.stopErr != nil:
		e.complete(j, e.stopErr)
	case j.torn:
		// The rewrite completes it; without one it cannot succeed.
		if _, ok := e.jobs[j.child]; !ok {
			e.complete(j, e.failErr())
		}
	case int(j.done) >= quorum:
		e.complete(j, nil)
	case e.possible(j) < quorum:
		e.complete(j, ErrNotEnoughReplicas)
	}
}

// complete settles j's outcome: its caller is told, and a rewrite passes
// its outcome to the torn write it stands for.
func (e *engine) complete(j *job, err error) {
	if j.completed {
		return
	}
	j.completed = true
	if j.kind == kindFlush && err == nil {
		e.flushedThrough = max(e.flushedThrough, j.id)
	}
	if j.hasCaller {
		e.emit(action{kind: actComplete, id: j.id, err: err})
	}
	if p, ok := e.jobs[j.parent]; ok && j.parent != 0 && p.child == j.id {
		p.child = 0
		if !p.completed {
			e.complete(p, err)
		}
		e.maybeRetire(p)
	}
}

func (e *engine) maybeRetire(j *job) {
	if !j.completed || j.privatizing || j.anyPending() || j.anySending() {
		return
	}
	e.retire(j)
}

func (e *engine) retire(j *job) {
	if e.jobs[j.id] != j {
		return
	}
	delete(e.jobs, j.id)
	if i, ok := slices.BinarySearchFunc(e.order, j.id, func(k *job, id wire.JobID) int {
		return compareIDs(k.id, id)
	}); ok {
		if j.kind == kindWrite {
			// Jobs mostly retire in order, so few older ones are live.
			for _, k := range e.order[:i] {
				if k.kind == kindWrite && k.overlaps(j) {
					k.superseded = true
				}
			}
		}
		e.order = slices.Delete(e.order, i, i+1)
	}
	e.liveJobs--
	e.liveBytes -= j.bytes
	e.emit(action{kind: actRetire, id: j.id})
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
