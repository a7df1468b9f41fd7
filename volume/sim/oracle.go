package sim

import (
	"fmt"

	"tern/volume/wire"
)

// noValue is what decodeBlock returns for content no write produced.
const noValue = ^uint64(0)

// oracle is what the callers know: every write's value (unique, and
// increasing in submission order, so in job order), which were
// acknowledged, and which flushes were. It judges reads and the final
// state.
type oracle struct {
	next   uint64 // next write value; 0 is a never-written block
	writes map[uint64]*wrec
	byJob  map[jobKey]*wrec
	// lastAcked is, per block, the greatest value of an acknowledged write.
	lastAcked []uint64
	reads     map[jobKey]readSnap
	flushes   map[jobKey]uint64 // the last value submitted before it
	// flushedUpTo is, per upstairs, the greatest value covered by a flush
	// it got acknowledged. A flush covers only its own upstairs' writes:
	// an activation at a higher generation keeps what was flushed and may
	// drop what was only acknowledged (reconcile's package doc).
	flushedUpTo [upstairsMax]uint64
	// current is the upstairs the workload uses.
	current int
	// voidBelow holds, per block every replica lost at once
	// (lostEverywhere), the first write value that still counts there.
	voidBelow map[uint64]uint64
}

type jobKey struct {
	up int
	id wire.JobID
}

// readSnap is, for each block of a read, the newest acknowledged write
// when it was submitted.
type readSnap struct {
	first  uint64
	floors []uint64
}

type wrec struct {
	up          int
	value       uint64
	first       uint64
	count       uint32
	acked, done bool
}

func (o *oracle) init(blocks uint64) {
	o.next = 1
	o.writes = map[uint64]*wrec{}
	o.byJob = map[jobKey]*wrec{}
	o.lastAcked = make([]uint64, blocks)
	o.reads = map[jobKey]readSnap{}
	o.flushes = map[jobKey]uint64{}
}

func (o *oracle) nextValue() uint64 { o.next++; return o.next - 1 }

// unused returns a value the workload did not submit after all.
func (o *oracle) unused(v uint64) {
	if v == o.next-1 {
		o.next--
	}
}

func (o *oracle) submitWrite(up int, id wire.JobID, val, first uint64, count uint32) {
	w := &wrec{up: up, value: val, first: first, count: count}
	o.writes[val] = w
	o.byJob[jobKey{up, id}] = w
}

func (o *oracle) writeDone(up int, id wire.JobID, ok bool) {
	w := o.byJob[jobKey{up, id}]
	if w == nil {
		return
	}
	delete(o.byJob, jobKey{up, id})
	w.done, w.acked = true, ok
	if !ok || up != o.current {
		// A fenced upstairs' late acknowledgement: the new one's
		// reconciliation keeps only what was flushed.
		return
	}
	for b := w.first; b < w.first+uint64(w.count); b++ {
		o.lastAcked[b] = max(o.lastAcked[b], w.value)
	}
}

func (o *oracle) submitRead(up int, id wire.JobID, first uint64, count uint32) {
	o.reads[jobKey{up, id}] = readSnap{first: first, floors: append([]uint64(nil), o.lastAcked[first:first+uint64(count)]...)}
}

func (o *oracle) readDone(up int, id wire.JobID) { delete(o.reads, jobKey{up, id}) }

func (o *oracle) submitFlush(up int, id wire.JobID) { o.flushes[jobKey{up, id}] = o.next - 1 }

func (o *oracle) flushDone(up int, id wire.JobID, ok bool) {
	k := jobKey{up, id}
	if ok {
		o.flushedUpTo[up] = max(o.flushedUpTo[up], o.flushes[k])
	}
	delete(o.flushes, k)
}

func (o *oracle) pendingFlush(up int, id wire.JobID) bool {
	_, ok := o.flushes[jobKey{up, id}]
	return ok
}

// covers reports whether v is the value of a write that touched b.
func (o *oracle) covers(v, b uint64) bool {
	w := o.writes[v]
	return w != nil && w.first <= b && b < w.first+uint64(w.count)
}

// checkRead judges block b of read id holding value v: it must be the
// newest write acknowledged before the read was submitted, or a newer
// write of b (in flight, failed, or submitted since).
func (o *oracle) checkRead(up int, id wire.JobID, b, v uint64) string {
	rs, ok := o.reads[jobKey{up, id}]
	if !ok {
		return ""
	}
	return o.judge(rs.floors[b-rs.first], b, v, "acknowledged")
}

func (o *oracle) judge(floor, b, v uint64, what string) string {
	switch {
	case v == noValue:
		return fmt.Sprintf("block %d holds data no write produced (fails its hash)", b)
	case v == floor:
		return ""
	case v < floor:
		return fmt.Sprintf("block %d holds value %d, older than %s write %d", b, v, what, floor)
	case !o.covers(v, b):
		return fmt.Sprintf("block %d holds value %d, which no write of the block had", b, v)
	}
	return ""
}

// checkDurable judges a block of the final state: it may not be older
// than the newest write of it covered by an acknowledged flush.
func (o *oracle) checkDurable(b, v uint64) string {
	floor := o.durable(b)
	if v != noValue && v > floor && !o.covers(v, b) {
		return fmt.Sprintf("holds value %d, which no write of the block had", v)
	}
	return o.judge(floor, b, v, "flushed")
}

// durable returns the value of the newest write of b that was
// acknowledged and covered by an acknowledged flush of its upstairs.
func (o *oracle) durable(b uint64) uint64 {
	for val := o.next - 1; val > 0 && val >= o.voidBelow[b]; val-- {
		if w := o.writes[val]; w != nil && w.acked && val <= o.flushedUpTo[w.up] && o.covers(val, b) {
			return val
		}
	}
	return 0
}

// takeover is told that a new upstairs starts: what the old one had
// acknowledged but not flushed may be gone, so the floor a read is held
// to falls back to the durable writes.
func (o *oracle) takeover(up int) {
	o.current = up
	for b := range o.lastAcked {
		o.lastAcked[b] = o.durable(uint64(b))
	}
}

// crashAll is told that every downstairs crashed at once: acknowledged,
// unflushed writes may be lost, so the floors of the blocks and of the
// reads in flight fall back to the durable writes.
func (o *oracle) crashAll() {
	// An acknowledged write not covered by an acknowledged flush may be
	// gone, so a later flush does not cover it either: it counts as if it
	// had failed (whatever it left is allowed, nothing is required).
	for val, w := range o.writes {
		if w.acked && val > o.flushedUpTo[w.up] {
			w.acked = false
		}
	}
	for b := range o.lastAcked {
		o.lastAcked[b] = o.durable(uint64(b))
	}
	for _, rs := range o.reads {
		for i := range rs.floors {
			rs.floors[i] = min(rs.floors[i], o.durable(rs.first+uint64(i)))
		}
	}
}

// void is told that every replica lost block b at once: no write
// submitted so far counts there any more, and reads in flight of it are
// held to nothing.
func (o *oracle) void(b uint64) {
	if o.voidBelow == nil {
		o.voidBelow = map[uint64]uint64{}
	}
	o.voidBelow[b] = o.next
	o.lastAcked[b] = 0
	for _, rs := range o.reads {
		if b >= rs.first && b < rs.first+uint64(len(rs.floors)) {
			rs.floors[b-rs.first] = 0
		}
	}
}
