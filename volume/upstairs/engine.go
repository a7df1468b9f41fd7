package upstairs

import (
	"errors"
	"slices"

	"tern/volume/ids"
	"tern/volume/reconcile"
	"tern/volume/wire"
)

// engine is the upstairs' decision core: the job list, per-replica queues
// and dependencies, quorum accounting and the replica state machine. It is
// plain data: no locks, no goroutines, no clock, no IO. Each input (a
// submission, a reply, a connection event) is one method call; the decisions
// it makes pile up in actions for the driver to carry out, in order, after
// the call. The driver serializes calls (it holds Upstairs.mu).
type engine struct {
	limits engineLimits

	nextID    wire.JobID
	nextFlush uint64
	running   bool // activated and not stopped
	stopErr   error
	// allAway: since no replica was Active, not all three are Active
	// again. Meanwhile a job counts every replica that can come back
	// (possible): each returns by replay, by restart reconciliation
	// (which replays every live job) or by live repair from the first one
	// back (which credits it), so none fails for the wait.
	allAway bool
	// flushedThrough is the newest flush acknowledged to its caller:
	// every write before it is durable on two replicas, so a restart
	// reconciliation's sources hold it (engine.restarted).
	flushedThrough wire.JobID

	jobs  map[wire.JobID]*job
	order []*job // live jobs in increasing ID order
	free  []*job

	replicas [replicaCount]replicaCore
	// extentBlocks is the region's extent size, for routing writes to a
	// replica under live repair (engine_live_repair.go).
	extentBlocks uint32

	// liveJobs and liveBytes count unretired jobs for backpressure.
	liveJobs  int
	liveBytes int

	actions []action
	spare   []action
}

// engineLimits bounds memory: an Offline replica faults once it owes more
// than backlogJobs or backlogBytes, and submission waits while more than
// inflightJobs or inflightBytes are unretired.
type engineLimits struct {
	backlogJobs   int
	backlogBytes  int
	inflightJobs  int
	inflightBytes int
}

// replicaCore is the engine's view of one replica.
type replicaCore struct {
	state ReplicaState
	queue jobQueue // jobs to send, in increasing ID order
	// owedJobs and owedBytes count jobs pending on this replica.
	owedJobs  int
	owedBytes int
	// live routes guest writes while the replica is Repairing; nil when
	// no live repair walks it.
	live *reconcile.LiveRepair
}

// actionKind says what the driver must do.
type actionKind uint8

const (
	// actWake: replica has jobs queued; wake its connection goroutine.
	actWake actionKind = iota + 1
	// actComplete: tell the caller of job its result (err may be nil).
	actComplete
	// actPrivatize: copy write job's data out of the caller's buffer,
	// recompute its hashes and report with privatized.
	actPrivatize
	// actRetire: the engine forgot job; free the driver's record of it.
	actRetire
	// actRepairRead: read job got good data after replica returned bad
	// blocks; the driver may copy the good data and call submitRepair.
	actRepairRead
	// actState: replica changed state (to state, on event).
	actState
	// actRewrite: job id is the rewrite of torn write parent; it sends the
	// parent's private copy.
	actRewrite
)

// action is one decision for the driver.
type action struct {
	kind    actionKind
	id      wire.JobID
	replica int
	state   ReplicaState
	event   replicaEvent // of actState
	parent  wire.JobID
	err     error
}

// Errors the engine hands to callers.
var (
	// errAbandoned completes a job whose caller gave up; the driver
	// reports the caller's context error instead.
	errAbandoned = errors.New("job abandoned by caller")
)

func newEngine(limits engineLimits) *engine {
	return &engine{
		limits: limits,
		nextID: 1000,
		jobs:   make(map[wire.JobID]*job),
	}
}

// takeActions hands the pending actions to the driver. The slice stays
// valid while the driver calls into the engine again (which collects new
// actions elsewhere) and is reused by the call after next.
func (e *engine) takeActions() []action {
	a := e.actions
	e.actions = e.spare[:0]
	e.spare = a
	return a
}

func (e *engine) emit(a action) { e.actions = append(e.actions, a) }

// activate starts IO with replicas Active (true) and the rest Faulted,
// numbering flushes from nextFlush.
func (e *engine) activate(active [replicaCount]bool, nextFlush uint64) {
	e.running = true
	e.nextFlush = nextFlush
	for r := range e.replicas {
		if active[r] {
			e.transition(r, evConnected)
		} else {
			e.transition(r, evFault)
		}
	}
}

// stop fails every job with err and stops all replicas; no IO is accepted
// afterwards. Jobs whose slots are busy in the driver stay until released.
func (e *engine) stop(err error) {
	if e.stopErr == nil {
		e.stopErr = err
	}
	e.running = false
	for r := range e.replicas {
		e.transition(r, evStop)
	}
	for _, j := range slices.Clone(e.order) {
		e.progress(j)
	}
}

// drained reports whether no Active replica owes a job: everything sent
// has been answered, so deactivating loses nothing a connected replica was
// given.
func (e *engine) drained() bool {
	for r := range e.replicas {
		if e.replicas[r].state == ReplicaActive && e.replicas[r].owedJobs > 0 {
			return false
		}
	}
	return true
}

// takers reports how many replicas can take a write now.
func (e *engine) takers() int {
	n := 0
	for r := range e.replicas {
		if e.replicas[r].state.takesIO() {
			n++
		}
	}
	return n
}

// full reports whether a submission of bytes must wait for space.
func (e *engine) full(bytes int) bool {
	if e.liveJobs == 0 {
		return false
	}
	return e.liveJobs >= e.limits.inflightJobs || e.liveBytes+bytes > e.limits.inflightBytes
}

// submitErr reports why no job can be submitted now, or nil.
func (e *engine) submitErr(kind jobKind) error {
	if e.stopErr != nil {
		return e.stopErr
	}
	if !e.running {
		return ErrNotActive
	}
	switch kind {
	case kindRead:
		for r := range e.replicas {
			if e.replicas[r].state.takesIO() {
				return nil
			}
		}
		return ErrNotEnoughReplicas
	default:
		// A Repairing replica will hold the job too (routed to it, or
		// brought by the copy and counted by creditRepaired, or replayed
		// after a restart reconciliation): the job waits for it.
		// While every replica is away or coming back (allAway), a
		// Faulted one counts too.
		n := e.takers()
		for r := range e.replicas {
			st := e.replicas[r].state
			if st == ReplicaRepairing || st == ReplicaFaulted && e.allAway {
				n++
			}
		}
		if n < quorum {
			return ErrNotEnoughReplicas
		}
	}
	return nil
}

// allocID reserves a JobID outside the engine's jobs (a repair call), so
// every request of a session carries an ID from the one sequence.
func (e *engine) allocID() wire.JobID {
	id := e.nextID
	e.nextID++
	return id
}

func (e *engine) newJob(kind jobKind, first ids.BlockIndex, count uint32, bytes int) *job {
	var j *job
	if n := len(e.free); n > 0 {
		j = e.free[n-1]
		e.free = e.free[:n-1]
	} else {
		j = new(job)
	}
	j.id = e.nextID
	e.nextID++
	j.kind, j.first, j.count, j.bytes = kind, first, count, bytes
	e.jobs[j.id] = j
	e.order = append(e.order, j)
	e.liveJobs++
	e.liveBytes += bytes
	return j
}

// submitWrite adds a caller's write of count blocks at first, whose data is
// in the caller's buffer, and queues it to every replica taking IO.
func (e *engine) submitWrite(first ids.BlockIndex, count uint32, bytes int) (wire.JobID, error) {
	if err := e.submitErr(kindWrite); err != nil {
		return 0, err
	}
	j := e.newJob(kindWrite, first, count, bytes)
	j.hasCaller, j.callerMem = true, true
	id := j.id // j may complete and retire (and be reused) while queued
	e.queueAll(j)
	return id, nil
}

// submitFlush adds a flush of everything submitted before it.
func (e *engine) submitFlush() (wire.JobID, error) {
	if err := e.submitErr(kindFlush); err != nil {
		return 0, err
	}
	j := e.newJob(kindFlush, 0, 0, 0)
	j.hasCaller = true
	j.flushNumber = e.nextFlush
	e.nextFlush++
	id := j.id
	e.queueAll(j)
	return id, nil
}

// submitRead adds a read and routes it to the Active replica with the
// least owed work, or parks it until one is Active.
func (e *engine) submitRead(first ids.BlockIndex, count uint32, bytes int) (wire.JobID, error) {
	if err := e.submitErr(kindRead); err != nil {
		return 0, err
	}
	j := e.newJob(kindRead, first, count, bytes)
	j.hasCaller = true
	id := j.id
	e.routeRead(j)
	return id, nil
}

// submitScrubRead adds a read served by replica r first (if it is
// Active): a block failing verification there is read from a peer and
// rewritten on r from that good copy (actRepairRead), as any read does.
func (e *engine) submitScrubRead(r int, first ids.BlockIndex, count uint32, bytes int) (wire.JobID, error) {
	if err := e.submitErr(kindRead); err != nil {
		return 0, err
	}
	j := e.newJob(kindRead, first, count, bytes)
	j.hasCaller = true
	j.pin = int8(r + 1)
	id := j.id
	e.routeRead(j)
	return id, nil
}

// submitRepair adds a write of good data to replica r only, fixing blocks
// that failed verification when read job readID was served. It refuses
// (returns false) when a write overlapping the range was submitted after the
// read, since that write rewrites the blocks anyway and the good data would
// be stale, or when r does not take IO.
func (e *engine) submitRepair(r int, readID wire.JobID, first ids.BlockIndex, count uint32, bytes int) (wire.JobID, bool) {
	if !e.running || e.replicas[r].state != ReplicaActive {
		return 0, false
	}
	probe := job{kind: kindWrite, first: first, count: count}
	for i := len(e.order) - 1; i >= 0 && e.order[i].id > readID; i-- {
		if k := e.order[i]; k.kind == kindWrite && k.overlaps(&probe) {
			return 0, false
		}
	}
	j := e.newJob(kindWrite, first, count, bytes)
	j.completed = true // nobody waits
	id := j.id
	e.queueTo(j, r)
	return id, true
}

// queueAll queues j to every replica that takes IO, and a write to a
// replica under live repair when its route says so.
func (e *engine) queueAll(j *job) {
	for r := range e.replicas {
		if e.receives(r, j) {
			e.queueTo(j, r)
		}
	}
	e.checkBacklogs()
}

// queueTo queues j to replica r, recording the earlier jobs it must follow
// there.
func (e *engine) queueTo(j *job, r int) {
	deps := j.deps[r][:0]
	for _, k := range e.order {
		if k.id >= j.id {
			break
		}
		if k.slot[r].pending() && j.conflicts(k) {
			deps = append(deps, k.id)
		}
	}
	j.deps[r] = deps
	j.slot[r] = slotQueued
	rc := &e.replicas[r]
	rc.owedJobs++
	rc.owedBytes += j.bytes
	rc.queue.insert(j)
	if rc.state == ReplicaActive || rc.state == ReplicaRepairing {
		e.emit(action{kind: actWake, replica: r})
	}
}

// routeRead queues read j to the Active replica with the least owed work
// that has not answered it yet; it parks j when none is Active but one may
// come back, and fails it when none can.
func (e *engine) routeRead(j *job) {
	if p := int(j.pin) - 1; p >= 0 && !j.readTried[p] && e.replicas[p].state == ReplicaActive {
		// A scrub read: this replica's copy is the one checked.
		j.parked = false
		e.queueTo(j, p)
		return
	}
	best := -1
	hope := false
	for r := range e.replicas {
		if j.readTried[r] {
			continue
		}
		switch e.replicas[r].state {
		case ReplicaActive:
			if best < 0 || e.replicas[r].owedJobs < e.replicas[best].owedJobs {
				best = r
			}
		case ReplicaOffline:
			hope = true
		}
	}
	switch {
	case best >= 0:
		j.parked = false
		e.queueTo(j, best)
	case hope:
		j.parked = true
	case j.anySlot(slotDone) || j.anySlot(slotFailed):
		e.complete(j, ErrCorrupt)
	default:
		e.complete(j, ErrNotEnoughReplicas)
	}
}

// takeNext hands the driver of replica r the next job to send and marks it
// sending. The driver calls sent (or disconnected) afterwards. A write
// being privatized waits: the driver is copying its data out of the
// caller's buffer, and a send started now would read that buffer after
// the caller may have been released. privatized wakes r when it may go
// on. It still counts as r's next job (nextJobID), so no call queued
// after it overtakes it.
func (e *engine) takeNext(r int) (*job, bool) {
	rc := &e.replicas[r]
	j := e.peekNext(r)
	if j == nil || j.privatizing {
		return nil, false
	}
	rc.queue.pop()
	j.slot[r] = slotSent
	j.sending[r] = true
	j.fromCaller[r] = j.callerMem
	return j, true
}

// sendDeps appends to dst the dependencies of j on r that are still pending
// there: jobs known to be done need no waiting, and jobs done in an earlier
// session are unknown to the downstairs.
func (e *engine) sendDeps(dst []wire.JobID, j *job, r int) []wire.JobID {
	for _, d := range j.deps[r] {
		if k, ok := e.jobs[d]; ok && k.slot[r].pending() {
			dst = append(dst, d)
		}
	}
	return dst
}

// sent records that the driver finished writing j's request to r (or gave
// up on it); it no longer reads the job's data.
func (e *engine) sent(r int, id wire.JobID) {
	j, ok := e.jobs[id]
	if !ok || !j.sending[r] {
		return
	}
	j.sending[r] = false
	e.progress(j)
}

// lookup returns the live job id.
func (e *engine) lookup(id wire.JobID) (*job, bool) {
	j, ok := e.jobs[id]
	return j, ok
}
