package engine

import "tern/volume/wire"

// jobQueue holds jobs in increasing ID order. Appends are the common case
// (IDs are issued in order); replays and rerouted reads insert. An entry
// may go stale (the job moved on, or retired and its struct was reused for
// another ID): each entry keeps the ID it was queued under, and pop skips
// entries whose job no longer carries it.
type jobQueue struct {
	items []queued
	head  int
}

type queued struct {
	id  wire.JobID
	job *Job
}

func (q *jobQueue) len() int { return len(q.items) - q.head }

func (q *jobQueue) insert(j *Job) {
	e := queued{id: j.ID, job: j}
	if n := len(q.items); n == q.head || q.items[n-1].id < j.ID {
		q.items = append(q.items, e)
		return
	}
	i := q.head
	for i < len(q.items) && q.items[i].id < j.ID {
		i++
	}
	q.items = append(q.items, queued{})
	copy(q.items[i+1:], q.items[i:])
	q.items[i] = e
}

// peek returns the oldest live entry without removing it.
func (q *jobQueue) peek() (*Job, bool) {
	for q.head < len(q.items) {
		e := q.items[q.head]
		if e.job.ID == e.id {
			return e.job, true
		}
		q.items[q.head] = queued{} // stale: drop it
		q.head++
	}
	q.items, q.head = q.items[:0], 0
	return nil, false
}

// pop returns the oldest live entry.
func (q *jobQueue) pop() (*Job, bool) {
	for q.head < len(q.items) {
		e := q.items[q.head]
		q.items[q.head] = queued{}
		q.head++
		if q.head == len(q.items) {
			q.items, q.head = q.items[:0], 0
		} else if q.head > 64 && q.head*2 > len(q.items) {
			n := copy(q.items, q.items[q.head:])
			clear(q.items[n:])
			q.items, q.head = q.items[:n], 0
		}
		if e.job.ID == e.id {
			return e.job, true
		}
	}
	return nil, false
}

func (q *jobQueue) clear() {
	clear(q.items)
	q.items, q.head = q.items[:0], 0
}
