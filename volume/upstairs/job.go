package upstairs

import (
	"tern/volume/ids"
	"tern/volume/wire"
)

// replicaCount is the number of downstairs behind one upstairs.
const replicaCount = 3

// quorum is how many replicas must complete a write or flush before the
// caller sees it acknowledged.
const quorum = 2

// jobKind says what a job does.
type jobKind uint8

const (
	kindWrite jobKind = iota + 1
	kindRead
	kindFlush
)

func (k jobKind) String() string {
	switch k {
	case kindWrite:
		return "write"
	case kindRead:
		return "read"
	case kindFlush:
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

// job is one request in the engine: plain data, pooled and reused.
type job struct {
	id    wire.JobID
	kind  jobKind
	first ids.BlockIndex
	count uint32 // blocks
	bytes int    // bulk data bytes (writes and reads)

	flushNumber uint64

	slot [replicaCount]slotState
	// deps[r] are the jobs j must follow on replica r, fixed when j was
	// queued to r (submit, reroute or rewrite).
	deps [replicaCount][]wire.JobID
	done uint8 // replicas in slotDone

	// sending[r]: r's driver is writing the request now; a write's data
	// may be read from the caller's buffer until it clears.
	sending [replicaCount]bool
	// fromCaller[r]: r was sent the data from the caller's buffer.
	fromCaller [replicaCount]bool

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
	// over it (engine.restarted skips it).
	superseded bool
	// abandoned: the caller gave up (context done) and must be released as
	// soon as its memory is no longer touched.
	abandoned bool
	// parent and child link a torn write and its rewrite.
	parent, child wire.JobID

	// readTried and readBad are replicas a read was answered by without
	// success, and those among them whose data failed verification.
	readTried [replicaCount]bool
	readBad   [replicaCount]bool
	parked    bool // a read waiting for any replica to become active
	// pin is 1 + the replica a scrub read asks first (0: any).
	pin int8
}

func (j *job) reset() {
	deps := j.deps
	*j = job{}
	for r := range deps {
		j.deps[r] = deps[r][:0]
	}
}

func (j *job) anySlot(s slotState) bool {
	for _, x := range j.slot {
		if x == s {
			return true
		}
	}
	return false
}

func (j *job) anySending() bool {
	return j.sending[0] || j.sending[1] || j.sending[2]
}

func (j *job) anyPending() bool {
	for _, x := range j.slot {
		if x.pending() {
			return true
		}
	}
	return false
}

// overlaps reports whether j and k touch a common block.
func (j *job) overlaps(k *job) bool {
	return j.first < k.first+ids.BlockIndex(k.count) && k.first < j.first+ids.BlockIndex(j.count)
}

// conflicts reports whether j, queued after earlier job k on one replica,
// must wait for k: flushes follow everything, writes follow overlapping
// reads and writes, reads follow overlapping writes.
func (j *job) conflicts(k *job) bool {
	switch {
	case j.kind == kindFlush:
		return true
	case k.kind == kindFlush:
		return false
	case j.kind == kindRead && k.kind == kindRead:
		return false
	}
	return j.overlaps(k)
}
