package downstairs

import "tern/volume/wire"

// access says what a job touches, for ordering.
type access uint8

const (
	// accessRead reads blocks [first, end).
	accessRead access = iota
	// accessWrite writes blocks [first, end).
	accessWrite
	// accessFlush makes every earlier write durable and stamps extents: it
	// is ordered against every write, flush and metadata read, in both
	// directions, but not against block reads.
	accessFlush
	// accessMeta reads region metadata (extent versions): ordered against
	// writes and flushes so it reports their effect.
	accessMeta
)

// jobKey is what the engine knows of a job: plain data, no IO.
type jobKey struct {
	id   wire.JobID
	deps []wire.JobID // owned by the caller; must stay unchanged until complete
	mode access
	// first and end bound the blocks touched (region-wide, end exclusive);
	// unused for accessFlush and accessMeta.
	first, end uint64
}

// conflicts reports whether two jobs must not run at the same time, which
// makes the later one wait for the earlier.
func conflicts(a, b *jobKey) bool {
	switch {
	case a.mode == accessRead && b.mode == accessRead:
		return false
	case a.mode == accessFlush || b.mode == accessFlush:
		other := a.mode
		if a.mode == accessFlush {
			other = b.mode
		}
		return other != accessRead
	case a.mode == accessMeta || b.mode == accessMeta:
		// Meta against a read, meta or write (flush handled above).
		return a.mode == accessWrite || b.mode == accessWrite
	}
	return a.first < b.end && b.first < a.end
}

type engineEntry struct {
	jobKey
	seq     uint64 // arrival number
	running bool
}

// engine is the job-ordering decision core of a session: it decides which
// jobs may run, and nothing else. It holds no locks, starts no goroutines
// and does no IO; the session's owner goroutine feeds it and acts on its
// answers.
//
// Rule: a job runs once every job it lists as a dependency has completed
// and no job that arrived before it and conflicts with it (overlapping
// blocks with a write on either side, or a flush against a write, flush or
// metadata read) is still pending. Jobs arrive in the upstairs' order on
// one stream, so a dependency that is not pending has completed (or never
// existed, which the downstairs cannot distinguish and treats the same).
// Only a dependency that arrived before the job counts: one on itself or
// on a job that arrives later is ignored (the upstairs lists only earlier
// jobs), so no dependency list can deadlock a session.
// Independent jobs run concurrently.
type engine struct {
	entries []engineEntry         // pending jobs (waiting or running), in arrival order
	pending map[wire.JobID]uint64 // arrival number of each pending job
	seq     uint64                // arrivals so far
	ready   []wire.JobID          // scratch returned by complete
}

func newEngine() *engine {
	return &engine{pending: make(map[wire.JobID]uint64)}
}

// submit adds a job and reports whether it may run now; if so it is marked
// running. A job ID that is already pending is refused (ok false) and not
// added.
func (e *engine) submit(k jobKey) (run, ok bool) {
	if _, dup := e.pending[k.id]; dup {
		return false, false
	}
	e.seq++
	e.entries = append(e.entries, engineEntry{jobKey: k, seq: e.seq})
	e.pending[k.id] = e.seq
	i := len(e.entries) - 1
	if e.runnable(i) {
		e.entries[i].running = true
		return true, true
	}
	return false, true
}

// runnable reports whether entry i's dependencies and earlier conflicting
// jobs have all completed.
func (e *engine) runnable(i int) bool {
	k := &e.entries[i].jobKey
	for _, d := range k.deps {
		if seq, waiting := e.pending[d]; waiting && seq < e.entries[i].seq {
			return false
		}
	}
	for j := range i {
		if conflicts(&e.entries[j].jobKey, k) {
			return false
		}
	}
	return true
}

// complete removes a running job and returns, in arrival order, the jobs
// that may now run (marked running). The returned slice is reused by the
// next call.
func (e *engine) complete(id wire.JobID) []wire.JobID {
	e.ready = e.ready[:0]
	idx := -1
	for i := range e.entries {
		if e.entries[i].id == id {
			idx = i
			break
		}
	}
	if idx < 0 || !e.entries[idx].running {
		return e.ready
	}
	copy(e.entries[idx:], e.entries[idx+1:])
	e.entries[len(e.entries)-1] = engineEntry{}
	e.entries = e.entries[:len(e.entries)-1]
	delete(e.pending, id)
	for i := range e.entries {
		if !e.entries[i].running && e.runnable(i) {
			e.entries[i].running = true
			e.ready = append(e.ready, e.entries[i].id)
		}
	}
	return e.ready
}

// drop removes every job that is not running and returns their IDs (the
// session is stopping and will never run them). The slice is reused.
func (e *engine) drop() []wire.JobID {
	e.ready = e.ready[:0]
	kept := e.entries[:0]
	for _, en := range e.entries {
		if en.running {
			kept = append(kept, en)
			continue
		}
		delete(e.pending, en.id)
		e.ready = append(e.ready, en.id)
	}
	clear(e.entries[len(kept):])
	e.entries = kept
	return e.ready
}

// len returns the number of pending jobs.
func (e *engine) len() int { return len(e.entries) }
