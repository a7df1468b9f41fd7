package upstairs

import (
	"tern/volume/ids"
	"tern/volume/reconcile"
	"tern/volume/wire"
)

// Core exposes the job engine (engine.go, engine_events.go) to a driver
// outside this package: the deterministic simulator of package
// tern/volume/sim runs the very same decision core as Upstairs, under
// a scheduler it controls instead of goroutines and sockets. Core adds no
// decisions of its own; each method is one engine call, and the actions
// the engine decides are handed out by TakeActions exactly as Upstairs'
// driver takes them. Like the engine, a Core is plain data and not safe
// for concurrent use.
type Core struct {
	e    *engine
	acts []CoreAction
}

// CoreLimits bounds a Core's memory as Config does an Upstairs': an
// Offline replica faults once it owes more than BacklogJobs or
// BacklogBytes, and Full reports true while more than InflightJobs or
// InflightBytes are unretired.
type CoreLimits struct {
	BacklogJobs   int
	BacklogBytes  int
	InflightJobs  int
	InflightBytes int
}

// ReplicaCount is the number of downstairs behind one upstairs.
const ReplicaCount = replicaCount

// CoreJobKind says what a job does.
type CoreJobKind uint8

// Job kinds.
const (
	CoreWrite CoreJobKind = CoreJobKind(kindWrite)
	CoreRead  CoreJobKind = CoreJobKind(kindRead)
	CoreFlush CoreJobKind = CoreJobKind(kindFlush)
)

// String returns the kind's name.
func (k CoreJobKind) String() string { return jobKind(k).String() }

// CoreActionKind says what the driver must do for a CoreAction.
type CoreActionKind uint8

// Action kinds, one for each of the engine's (see engine.go).
const (
	// ActWake: Replica has jobs queued; send them (TakeNext).
	ActWake CoreActionKind = CoreActionKind(actWake)
	// ActComplete: tell the caller of ID its result, Err (may be nil).
	ActComplete CoreActionKind = CoreActionKind(actComplete)
	// ActPrivatize: copy write ID's data out of the caller's buffer and
	// call Privatized.
	ActPrivatize CoreActionKind = CoreActionKind(actPrivatize)
	// ActRetire: the engine forgot job ID.
	ActRetire CoreActionKind = CoreActionKind(actRetire)
	// ActRepairRead: read ID got good data after Replica returned bad
	// blocks; the driver may write the good data back with SubmitRepair.
	ActRepairRead CoreActionKind = CoreActionKind(actRepairRead)
	// ActState: Replica changed state to State.
	ActState CoreActionKind = CoreActionKind(actState)
	// ActRewrite: job ID rewrites torn write Parent from its private copy.
	ActRewrite CoreActionKind = CoreActionKind(actRewrite)
)

// CoreAction is one decision of the engine for the driver.
type CoreAction struct {
	Kind    CoreActionKind
	ID      wire.JobID
	Replica int
	State   ReplicaState
	Parent  wire.JobID
	Err     error
}

// CoreJob is a job handed to the driver of one replica to send.
type CoreJob struct {
	ID          wire.JobID
	Kind        CoreJobKind
	First       ids.BlockIndex
	Count       uint32
	FlushNumber uint64
	// FromCaller: a write's data is to be taken from the caller's buffer
	// (false: from the private copy made on ActPrivatize).
	FromCaller bool
	// Deps are the earlier jobs still pending on the replica that this one
	// must follow there.
	Deps []wire.JobID
}

// ReadOutcome is what the driver found in a read reply.
type ReadOutcome uint8

// Read outcomes.
const (
	// ReadGood: every block matched its hash.
	ReadGood ReadOutcome = ReadOutcome(readGood)
	// ReadBadData: a block failed verification or was reported corrupt.
	ReadBadData ReadOutcome = ReadOutcome(readBadData)
	// ReadFailed: the replica could not serve the read.
	ReadFailed ReadOutcome = ReadOutcome(readFailed)
)

// NewCore returns an engine with limits over a region of extentBlocks
// blocks per extent (for live-repair routing), not yet activated.
func NewCore(limits CoreLimits, extentBlocks uint32) *Core {
	e := newEngine(engineLimits{
		backlogJobs:   limits.BacklogJobs,
		backlogBytes:  limits.BacklogBytes,
		inflightJobs:  limits.InflightJobs,
		inflightBytes: limits.InflightBytes,
	})
	e.setExtentBlocks(extentBlocks)
	return &Core{e: e}
}

// Activate starts IO with the replicas marked active; the others are
// Faulted. Flushes are numbered from nextFlush.
func (c *Core) Activate(active [ReplicaCount]bool, nextFlush uint64) { c.e.activate(active, nextFlush) }

// Stop fails every job with err; no IO is accepted afterwards.
func (c *Core) Stop(err error) { c.e.stop(err) }

// SubmitWrite adds a write of count blocks at first.
func (c *Core) SubmitWrite(first ids.BlockIndex, count uint32, bytes int) (wire.JobID, error) {
	return c.e.submitWrite(first, count, bytes)
}

// SubmitRead adds a read of count blocks at first.
func (c *Core) SubmitRead(first ids.BlockIndex, count uint32, bytes int) (wire.JobID, error) {
	return c.e.submitRead(first, count, bytes)
}

// SubmitFlush adds a flush of everything submitted before it.
func (c *Core) SubmitFlush() (wire.JobID, error) { return c.e.submitFlush() }

// SubmitRepair adds a write of good data to replica r only, fixing blocks
// read job readID found bad there; false when refused (see engine).
func (c *Core) SubmitRepair(r int, readID wire.JobID, first ids.BlockIndex, count uint32, bytes int) (wire.JobID, bool) {
	return c.e.submitRepair(r, readID, first, count, bytes)
}

// Full reports whether a submission of bytes must wait (backpressure).
func (c *Core) Full(bytes int) bool { return c.e.full(bytes) }

// TakeNext hands the driver of replica r its next job to send, with the
// dependencies still pending there appended to deps[:0].
func (c *Core) TakeNext(r int, deps []wire.JobID) (CoreJob, bool) {
	j, ok := c.e.takeNext(r)
	if !ok {
		return CoreJob{}, false
	}
	return CoreJob{
		ID: j.id, Kind: CoreJobKind(j.kind), First: j.first, Count: j.count,
		FlushNumber: j.flushNumber, FromCaller: j.fromCaller[r],
		Deps: c.e.sendDeps(deps[:0], j, r),
	}, true
}

// Sent records that the driver finished sending id to r.
func (c *Core) Sent(r int, id wire.JobID) { c.e.sent(r, id) }

// Done records that r applied write or flush id.
func (c *Core) Done(r int, id wire.JobID) { c.e.done(r, id) }

// Rejected records that r refused write id for a hash mismatch.
func (c *Core) Rejected(r int, id wire.JobID) { c.e.rejected(r, id) }

// Failed records that r could not run write or flush id.
func (c *Core) Failed(r int, id wire.JobID) { c.e.failed(r, id) }

// ReadBegin is called before read id's data from r lands in the caller's
// buffer; false means discard it.
func (c *Core) ReadBegin(r int, id wire.JobID) bool { return c.e.readBegin(r, id) }

// ReadResult records the outcome of read id on r.
func (c *Core) ReadResult(r int, id wire.JobID, out ReadOutcome) {
	c.e.readResult(r, id, readOutcome(out))
}

// Privatized records that write id's data was copied out of the caller's
// buffer; same reports whether the copy has the hashes sent.
func (c *Core) Privatized(id wire.JobID, same bool) { c.e.privatized(id, same) }

// Abandon records that the caller of id gave up.
func (c *Core) Abandon(id wire.JobID) { c.e.abandon(id) }

// FlushedOn records that r's extents show flush number flush applied.
func (c *Core) FlushedOn(r int, flush uint64) { c.e.flushedOn(r, flush) }

// Connected records an activated session to r (a replay, if Offline).
func (c *Core) Connected(r int) { c.e.connected(r) }

// Disconnected records that r's connection is gone.
func (c *Core) Disconnected(r int) { c.e.disconnected(r) }

// Fault marks r as needing repair.
func (c *Core) Fault(r int) { c.e.fault(r) }

// RepairStarted moves Faulted r, or Offline r that may have lost writes,
// to Repairing.
func (c *Core) RepairStarted(r int) bool { return c.e.repairStarted(r) }

// RepairDone moves Repairing r to Active.
func (c *Core) RepairDone(r int) bool { return c.e.repairDone(r) }

// CoreRejoin is what becomes of a replica whose new session activated
// while the volume runs (see Rejoin).
type CoreRejoin uint8

// Rejoin decisions, one for each of the engine's (engine_restart.go).
const (
	// RejoinNone: nothing to decide.
	RejoinNone CoreRejoin = CoreRejoin(rejoinNone)
	// RejoinReplay: Connected replays the backlog of an intact replica.
	RejoinReplay CoreRejoin = CoreRejoin(rejoinReplay)
	// RejoinRepair: fault an Offline replica, then live-repair it from an
	// Active peer.
	RejoinRepair CoreRejoin = CoreRejoin(rejoinRepair)
	// RejoinHold: no peer is Active; hold the session for a restart
	// reconciliation (Restarted).
	RejoinHold CoreRejoin = CoreRejoin(rejoinHold)
)

// String returns the decision's name.
func (k CoreRejoin) String() string { return rejoinKind(k).String() }

// Rejoin decides what becomes of r, whose new session activated;
// lostWrites is its downstairs' ActivateAck.LostWrites.
func (c *Core) Rejoin(r int, lostWrites bool) CoreRejoin {
	return CoreRejoin(c.e.rejoin(r, lostWrites))
}

// AnyActive reports whether a replica is Active.
func (c *Core) AnyActive() bool { return c.e.anyActive() }

// NextFlush returns the flush number the next flush gets: every flush
// number issued so far is below it.
func (c *Core) NextFlush() uint64 { return c.e.nextFlush }

// Restarted ends a restart reconciliation of the replicas in part, whose
// extents carry flush numbers below nextFlush: every live write and flush
// is replayed to each, and they are Active; the others are faulted.
func (c *Core) Restarted(part [ReplicaCount]bool, nextFlush uint64) { c.e.restarted(part, nextFlush) }

// AttachLiveRepair routes guest writes to Repairing r by walk.
func (c *Core) AttachLiveRepair(r int, walk *reconcile.LiveRepair) { c.e.attachLiveRepair(r, walk) }

// DetachLiveRepair stops routing writes to r by walk.
func (c *Core) DetachLiveRepair(r int, walk *reconcile.LiveRepair) { c.e.detachLiveRepair(r, walk) }

// NextJobID returns the ID of the next job r may be sent, or 0.
func (c *Core) NextJobID(r int) wire.JobID { return c.e.nextJobID(r) }

// AllocID reserves a job ID from the engine's sequence (a repair call).
func (c *Core) AllocID() wire.JobID { return c.e.allocID() }

// State returns replica r's state.
func (c *Core) State(r int) ReplicaState { return c.e.replicas[r].state }

// Owed returns the jobs and bytes replica r owes.
func (c *Core) Owed(r int) (jobs, bytes int) {
	return c.e.replicas[r].owedJobs, c.e.replicas[r].owedBytes
}

// Live returns the unretired jobs and their bytes.
func (c *Core) Live() (jobs, bytes int) { return c.e.liveJobs, c.e.liveBytes }

// Running reports whether the core is activated and not stopped.
func (c *Core) Running() bool { return c.e.running }

// Drained reports whether no Active replica owes a job.
func (c *Core) Drained() bool { return c.e.drained() }

// TakeActions returns the actions decided since the last call. The slice
// is reused by the next call.
func (c *Core) TakeActions() []CoreAction {
	c.acts = c.acts[:0]
	for _, a := range c.e.takeActions() {
		c.acts = append(c.acts, CoreAction{
			Kind: CoreActionKind(a.kind), ID: a.id, Replica: a.replica,
			State: a.state, Parent: a.parent, Err: a.err,
		})
	}
	return c.acts
}
