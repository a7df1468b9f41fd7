package engine

import (
	"tern/volume/ids"
	"tern/volume/wire"
)

// replicaCount is the number of downstairs behind one upstairs.
const ReplicaCount = 3

// quorum is how many replicas must complete a write or flush before the
// caller sees it acknowledged.
const Quorum = 2

// JobKind says what a job does.
type JobKind uint8

const (
	KindWrite JobKind = iota + 1
	KindRead
	KindFlush
)

func (k JobKind) String() string {
	switch k {
	case KindWrite:
		return "write"
	case KindRead:
		return "read"
	case KindFlush:
		return "flush"
	}
	return "unknown"
}

// slotState is a job's progress on one replica.
type slotState uint8

const (
	// slotNone: the job is not for this replica (a read routed elsewhere,
	// or a replica that was not taking IO when the job was submitted).
	slotNone slotState = iota
	// slotQueued: waiting to be sent (or replayed).
	slotQueued
	// slotSent: sent, reply outstanding.
	slotSent
	// slotReceiving: a read reply is being decoded into the caller's buffer.
	slotReceiving
	// slotDone: the replica applied the job.
	slotDone
	// slotFailed: the replica finished the job without applying it.
	slotFailed
	// slotSkipped: the replica faulted and will never run the job.
	slotSkipped
)

// pending reports whether the replica still owes an answer.
func (s slotState) pending() bool {
	return s == slotQueued || s == slotSent || s == slotReceiving
}

// Job is one request in the engine: plain data, pooled and reused.
type Job struct {
	ID    wire.JobID
	Kind  JobKind
	First ids.BlockIndex
	Count uint32 // blocks
	Bytes int    // bulk data bytes (writes and reads)

	FlushNumber uint64

	slot [ReplicaCount]slotState
	// deps[r] are the jobs j must follow on replica r, fixed when j was
	// queued to r (submit, reroute or rewrite).
	deps [ReplicaCount][]wire.JobID
	done uint8 // replicas in slotDone

	// sending[r]: r's driver is writing the request now; a write's data
	// may be read from the caller's buffer until it clears.
	sending [ReplicaCount]bool
	// fromCaller[r]: r was sent the data from the caller's buffer.
	fromCaller [ReplicaCount]bool

	// hasCaller: a caller waits for completion (false for rewrites and
	// read repairs).
	hasCaller bool
	// completed: the caller was told (or there is none).
	completed bool
	// callerMem: a write's data still lives in the caller's buffer.
	callerMem bool
	// privatizing: the driver is copying the data out of the caller's
	// buffer. No replica starts sending the job meanwhile (sendable), so
	// once the copy is in place nothing reads the caller's buffer or the
	// hashes computed into its waiter, and the caller may be released.
	privatizing bool
	// torn: a replica saw data that did not match the hashes, so the caller
	// changed the buffer in flight; the job completes with its rewrite.
	torn bool
	// superseded: a later write overlapping this one retired (every
	// replica applied it), so replaying this one would put older data
	// over it (Engine.Restarted skips it).
	superseded bool
	// abandoned: the caller gave up (context done) and must be released as
	// soon as its memory is no longer touched.
	abandoned bool
	// parent and child link a torn write and its rewrite.
	parent, child wire.JobID

	// readTried and readBad are replicas a read was answered by without
	// success, and those among them whose data failed verification.
	readTried [ReplicaCount]bool
	readBad   [ReplicaCount]bool
	parked    bool // a read waiting for any replica to become active
	// pin is 1 + the replica a scrub read asks first (0: any).
	pin int8
}

// FromCaller reports whether replica r was sent a write's data from the
// caller's buffer (false: from the private copy made on ActPrivatize).
func (j *Job) FromCaller(r int) bool { return j.fromCaller[r] }

func (j *Job) reset() {
	deps := j.deps
	*j = Job{}
	for r := range deps {
		j.deps[r] = deps[r][:0]
	}
}

func (j *Job) anySlot(s slotState) bool {
	for _, x := range j.slot {
		if x == s {
			return true
		}
	}
	return false
}

func (j *Job) anySending() bool {
	return j.sending[0] || j.sending[1] || j.sending[2]
}

func (j *Job) anyPending() bool {
	for _, x := range j.slot {
		if x.pending() {
			return true
		}
	}
	return false
}

// overlaps reports whether j and k touch a common block.
func (j *Job) overlaps(k *Job) bool {
	return j.First < k.First+ids.BlockIndex(k.Count) && k.First < j.First+ids.BlockIndex(j.Count)
}

// conflicts reports whether j, queued after earlier job k on one replica,
// must wait for k: flushes follow everything, writes follow overlapping
// reads and writes, reads follow overlapping writes.
func (j *Job) conflicts(k *Job) bool {
	switch {
	case j.Kind == KindFlush:
		return true
	case k.Kind == KindFlush:
		return false
	case j.Kind == KindRead && k.Kind == KindRead:
		return false
	}
	return j.overlaps(k)
}
