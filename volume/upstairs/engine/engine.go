package engine

import (
	"errors"
	"slices"

	"tern/volume/ids"
	"tern/volume/reconcile"
	"tern/volume/wire"
)

// Engine is the upstairs' decision core: the job list, per-replica queues
// and dependencies, quorum accounting and the replica state machine. It is
// plain data: no locks, no goroutines, no clock, no IO. Each input (a
// submission, a reply, a connection event) is one method call; the decisions
// it makes pile up in actions for the driver to carry out, in order, after
// the call. The driver serializes calls (it holds Upstairs.mu).
type Engine struct {
	limits Limits

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
	// reconciliation's sources hold it (Engine.Restarted).
	flushedThrough wire.JobID

	jobs  map[wire.JobID]*Job
	order []*Job // live jobs in increasing ID order
	free  []*Job

	replicas [ReplicaCount]replicaCore
	// extentBlocks is the region's extent size, for routing writes to a
	// replica under live repair (live_repair.go).
	extentBlocks uint32

	// liveJobs and liveBytes count unretired jobs for backpressure.
	liveJobs  int
	liveBytes int

	actions []Action
	spare   []Action
}

// Limits bounds memory: an Offline replica faults once it owes more
// than backlogJobs or backlogBytes, and submission waits while more than
// inflightJobs or inflightBytes are unretired.
type Limits struct {
	BacklogJobs   int
	BacklogBytes  int
	InflightJobs  int
	InflightBytes int
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

// ActionKind says what the driver must do.
type ActionKind uint8

const (
	// ActWake: replica has jobs queued; wake its connection goroutine.
	ActWake ActionKind = iota + 1
	// ActComplete: tell the caller of job its result (err may be nil).
	ActComplete
	// ActPrivatize: copy write job's data out of the caller's buffer,
	// recompute its hashes and report with privatized.
	ActPrivatize
	// ActRetire: the engine forgot job; free the driver's record of it.
	ActRetire
	// ActRepairRead: read job got good data after replica returned bad
	// blocks; the driver may copy the good data and call submitRepair.
	ActRepairRead
	// ActState: replica changed state (to state, on event).
	ActState
	// ActRewrite: job id is the rewrite of torn write parent; it sends the
	// parent's private copy.
	ActRewrite
)

// Action is one decision for the driver.
type Action struct {
	Kind    ActionKind
	ID      wire.JobID
	Replica int
	State   ReplicaState
	Event   ReplicaEvent // of actState
	Parent  wire.JobID
	Err     error
}

// Errors the engine hands to callers.
var (
	// ErrAbandoned completes a job whose caller gave up; the driver
	// reports the caller's context error instead.
	ErrAbandoned = errors.New("job abandoned by caller")
)

// New returns an engine bounded by limits, not yet activated (Activate).
func New(limits Limits) *Engine {
	return &Engine{
		limits: limits,
		nextID: 1000,
		jobs:   make(map[wire.JobID]*Job),
	}
}

// State returns replica r's state.
func (e *Engine) State(r int) ReplicaState { return e.replicas[r].state }

// Owed returns the jobs, and their bytes, replica r still owes an answer.
func (e *Engine) Owed(r int) (jobs, bytes int) {
	return e.replicas[r].owedJobs, e.replicas[r].owedBytes
}

// Live returns the unretired jobs and their bytes (what backpressure counts).
func (e *Engine) Live() (jobs, bytes int) { return e.liveJobs, e.liveBytes }

// Limits returns the bounds the engine was created with.
func (e *Engine) Limits() Limits { return e.limits }

// Running reports whether the engine is activated and not stopped.
func (e *Engine) Running() bool { return e.running }

// StopErr returns the error the engine was stopped with, or nil.
func (e *Engine) StopErr() error { return e.stopErr }

// NextFlush returns the flush number the next flush gets: every flush
// number issued so far is below it.
func (e *Engine) NextFlush() uint64 { return e.nextFlush }

// TakeActions hands the pending actions to the driver. The slice stays
// valid while the driver calls into the engine again (which collects new
// actions elsewhere) and is reused by the call after next.
func (e *Engine) TakeActions() []Action {
	a := e.actions
	e.actions = e.spare[:0]
	e.spare = a
	return a
}

func (e *Engine) emit(a Action) { e.actions = append(e.actions, a) }

// Activate starts IO with replicas Active (true) and the rest Faulted,
// numbering flushes from nextFlush.
func (e *Engine) Activate(active [ReplicaCount]bool, nextFlush uint64) {
	e.running = true
	e.nextFlush = nextFlush
	for r := range e.replicas {
		if active[r] {
			e.transition(r, EventConnected)
		} else {
			e.transition(r, EventFault)
		}
	}
}

// Stop fails every job with err and stops all replicas; no IO is accepted
// afterwards. Jobs whose slots are busy in the driver stay until released.
func (e *Engine) Stop(err error) {
	if e.stopErr == nil {
		e.stopErr = err
	}
	e.running = false
	for r := range e.replicas {
		e.transition(r, EventStop)
	}
	for _, j := range slices.Clone(e.order) {
		e.progress(j)
	}
}

// Drained reports whether no Active replica owes a job: everything sent
// has been answered, so deactivating loses nothing a connected replica was
// given.
func (e *Engine) Drained() bool {
	for r := range e.replicas {
		if e.replicas[r].state == ReplicaActive && e.replicas[r].owedJobs > 0 {
			return false
		}
	}
	return true
}

// takers reports how many replicas can take a write now.
func (e *Engine) takers() int {
	n := 0
	for r := range e.replicas {
		if e.replicas[r].state.takesIO() {
			n++
		}
	}
	return n
}

// Full reports whether a submission of bytes must wait for space.
func (e *Engine) Full(bytes int) bool {
	if e.liveJobs == 0 {
		return false
	}
	return e.liveJobs >= e.limits.InflightJobs || e.liveBytes+bytes > e.limits.InflightBytes
}

// SubmitErr reports why no job can be submitted now, or nil.
func (e *Engine) SubmitErr(kind JobKind) error {
	if e.stopErr != nil {
		return e.stopErr
	}
	if !e.running {
		return ErrNotActive
	}
	switch kind {
	case KindRead:
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
		if n < Quorum {
			return ErrNotEnoughReplicas
		}
	}
	return nil
}

// AllocID reserves a JobID outside the engine's jobs (a repair call), so
// every request of a session carries an ID from the one sequence.
func (e *Engine) AllocID() wire.JobID {
	id := e.nextID
	e.nextID++
	return id
}

func (e *Engine) newJob(kind JobKind, first ids.BlockIndex, count uint32, bytes int) *Job {
	var j *Job
	if n := len(e.free); n > 0 {
		j = e.free[n-1]
		e.free = e.free[:n-1]
	} else {
		j = new(Job)
	}
	j.ID = e.nextID
	e.nextID++
	j.Kind, j.First, j.Count, j.Bytes = kind, first, count, bytes
	e.jobs[j.ID] = j
	e.order = append(e.order, j)
	e.liveJobs++
	e.liveBytes += bytes
	return j
}

// SubmitWrite adds a caller's write of count blocks at first, whose data is
// in the caller's buffer, and queues it to every replica taking IO.
func (e *Engine) SubmitWrite(first ids.BlockIndex, count uint32, bytes int) (wire.JobID, error) {
	if err := e.SubmitErr(KindWrite); err != nil {
		return 0, err
	}
	j := e.newJob(KindWrite, first, count, bytes)
	j.hasCaller, j.callerMem = true, true
	id := j.ID // j may complete and retire (and be reused) while queued
	e.queueAll(j)
	return id, nil
}

// SubmitFlush adds a flush of everything submitted before it.
func (e *Engine) SubmitFlush() (wire.JobID, error) {
	if err := e.SubmitErr(KindFlush); err != nil {
		return 0, err
	}
	j := e.newJob(KindFlush, 0, 0, 0)
	j.hasCaller = true
	j.FlushNumber = e.nextFlush
	e.nextFlush++
	id := j.ID
	e.queueAll(j)
	return id, nil
}

// SubmitRead adds a read and routes it to the Active replica with the
// least owed work, or parks it until one is Active.
func (e *Engine) SubmitRead(first ids.BlockIndex, count uint32, bytes int) (wire.JobID, error) {
	if err := e.SubmitErr(KindRead); err != nil {
		return 0, err
	}
	j := e.newJob(KindRead, first, count, bytes)
	j.hasCaller = true
	id := j.ID
	e.routeRead(j)
	return id, nil
}

// SubmitScrubRead adds a read served by replica r first (if it is
// Active): a block failing verification there is read from a peer and
// rewritten on r from that good copy (actRepairRead), as any read does.
func (e *Engine) SubmitScrubRead(r int, first ids.BlockIndex, count uint32, bytes int) (wire.JobID, error) {
	if err := e.SubmitErr(KindRead); err != nil {
		return 0, err
	}
	j := e.newJob(KindRead, first, count, bytes)
	j.hasCaller = true
	j.pin = int8(r + 1)
	id := j.ID
	e.routeRead(j)
	return id, nil
}

// SubmitRepair adds a write of good data to replica r only, fixing blocks
// that failed verification when read job readID was served. It refuses
// (returns false) when a write overlapping the range was submitted after the
// read, since that write rewrites the blocks anyway and the good data would
// be stale, or when r does not take IO.
func (e *Engine) SubmitRepair(r int, readID wire.JobID, first ids.BlockIndex, count uint32, bytes int) (wire.JobID, bool) {
	if !e.running || e.replicas[r].state != ReplicaActive {
		return 0, false
	}
	probe := Job{Kind: KindWrite, First: first, Count: count}
	for i := len(e.order) - 1; i >= 0 && e.order[i].ID > readID; i-- {
		if k := e.order[i]; k.Kind == KindWrite && k.overlaps(&probe) {
			return 0, false
		}
	}
	j := e.newJob(KindWrite, first, count, bytes)
	j.completed = true // nobody waits
	id := j.ID
	e.queueTo(j, r)
	return id, true
}

// queueAll queues j to every replica that takes IO, and a write to a
// replica under live repair when its route says so.
func (e *Engine) queueAll(j *Job) {
	for r := range e.replicas {
		if e.receives(r, j) {
			e.queueTo(j, r)
		}
	}
	e.checkBacklogs()
}

// queueTo queues j to replica r, recording the earlier jobs it must follow
// there.
func (e *Engine) queueTo(j *Job, r int) {
	deps := j.deps[r][:0]
	for _, k := range e.order {
		if k.ID >= j.ID {
			break
		}
		if k.slot[r].pending() && j.conflicts(k) {
			deps = append(deps, k.ID)
		}
	}
	j.deps[r] = deps
	j.slot[r] = slotQueued
	rc := &e.replicas[r]
	rc.owedJobs++
	rc.owedBytes += j.Bytes
	rc.queue.insert(j)
	if rc.state == ReplicaActive || rc.state == ReplicaRepairing {
		e.emit(Action{Kind: ActWake, Replica: r})
	}
}

// routeRead queues read j to the Active replica with the least owed work
// that has not answered it yet; it parks j when none is Active but one may
// come back, and fails it when none can.
func (e *Engine) routeRead(j *Job) {
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

// TakeNext hands the driver of replica r the next job to send and marks it
// sending. The driver calls sent (or disconnected) afterwards. A write
// being privatized waits: the driver is copying its data out of the
// caller's buffer, and a send started now would read that buffer after
// the caller may have been released. privatized wakes r when it may go
// on. It still counts as r's next job (nextJobID), so no call queued
// after it overtakes it.
func (e *Engine) TakeNext(r int) (*Job, bool) {
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

// SendDeps appends to dst the dependencies of j on r that are still pending
// there: jobs known to be done need no waiting, and jobs done in an earlier
// session are unknown to the downstairs.
func (e *Engine) SendDeps(dst []wire.JobID, j *Job, r int) []wire.JobID {
	for _, d := range j.deps[r] {
		if k, ok := e.jobs[d]; ok && k.slot[r].pending() {
			dst = append(dst, d)
		}
	}
	return dst
}

// Sent records that the driver finished writing j's request to r (or gave
// up on it); it no longer reads the job's data.
func (e *Engine) Sent(r int, id wire.JobID) {
	j, ok := e.jobs[id]
	if !ok || !j.sending[r] {
		return
	}
	j.sending[r] = false
	e.progress(j)
}

// Lookup returns the live job id.
func (e *Engine) Lookup(id wire.JobID) (*Job, bool) {
	j, ok := e.jobs[id]
	return j, ok
}
