package downstairs

import (
	"tern/volume/ids"
	"tern/volume/wire"
)

// Access says what a job submitted to a JobOrder touches.
type Access uint8

// Accesses, as the engine orders them (engine.go).
const (
	// AccessRead reads blocks [first, end).
	AccessRead = Access(accessRead)
	// AccessWrite writes blocks [first, end).
	AccessWrite = Access(accessWrite)
	// AccessFlush makes earlier writes durable: ordered against every
	// write, flush and metadata read.
	AccessFlush = Access(accessFlush)
	// AccessMeta reads region metadata.
	AccessMeta = Access(accessMeta)
)

// JobOrder exposes a session's job-ordering engine (engine.go) to a driver
// outside this package: the deterministic simulator of package
// tern/volume/sim orders each simulated session's jobs with the very
// decision core a Server's sessions use. It adds no decisions of its own
// and, like the engine, is not safe for concurrent use.
type JobOrder struct{ e *engine }

// NewJobOrder returns an empty job order for one session.
func NewJobOrder() *JobOrder { return &JobOrder{e: newEngine()} }

// Submit adds a job and reports whether it may run now (it is then marked
// running); ok is false for a job ID already pending. deps must stay
// unchanged until the job completes.
func (o *JobOrder) Submit(id wire.JobID, deps []wire.JobID, mode Access, first, end uint64) (run, ok bool) {
	return o.e.submit(jobKey{id: id, deps: deps, mode: access(mode), first: first, end: end})
}

// Complete removes running job id and returns, in arrival order, the jobs
// that may run now (marked running). The slice is reused by the next call.
func (o *JobOrder) Complete(id wire.JobID) []wire.JobID { return o.e.complete(id) }

// Drop removes every job not running and returns their IDs. The slice is
// reused by the next call.
func (o *JobOrder) Drop() []wire.JobID { return o.e.drop() }

// Len returns the number of pending jobs.
func (o *JobOrder) Len() int { return o.e.len() }

// Request names a request kind for a driver outside this package (the
// simulator), so it asks the session's own rules what to do with one.
type Request uint8

// Requests a session admits and orders (Activate and RegionInfo are
// answered by the session's owner itself).
const (
	RequestRead           = Request(kindRead)
	RequestWrite          = Request(kindWrite)
	RequestFlush          = Request(kindFlush)
	RequestExtentVersions = Request(kindExtentVersions)
	RequestExtentHashes   = Request(kindExtentHashes)
	RequestRepairRead     = Request(kindRepairRead)
	RequestRepairWrite    = Request(kindRepairWrite)
)

// Admit is a session's admission rule (session.handle) for a request of a
// session that is not fenced: ok, or the code to refuse it with.
// flushGen is a flush's generation and sessionGen the session's.
func Admit(r Request, readOnly, active bool, flushGen, sessionGen ids.Generation) (code wire.ErrorCode, ok bool) {
	return admit(jobKind(r), readOnly, active, flushGen, sessionGen)
}

// AccessOf is what a request touches, as a session orders it: blocks
// [offset, offset+count) for a read or write, extent's blocks for a
// repair request, for Submit.
func AccessOf(r Request, offset, count uint64, extent ids.ExtentID, extentBlocks uint32) (mode Access, first, end uint64) {
	m, first, end := accessOf(jobKind(r), offset, count, extent, extentBlocks)
	return Access(m), first, end
}
