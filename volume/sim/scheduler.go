package sim

import (
	"container/heap"
	"fmt"
	"math/rand/v2"
	"strconv"

	"github.com/cespare/xxhash/v2"
)

// Tick is simulated time. Nothing in the simulation reads a real clock.
type Tick uint64

// event is one scheduled step of the simulation.
type event struct {
	at   Tick
	seq  uint64 // scheduling order, breaks ties at one tick
	name string
	fn   func()
}

type eventHeap []*event

func (h eventHeap) Len() int { return len(h) }
func (h eventHeap) Less(i, j int) bool {
	if h[i].at != h[j].at {
		return h[i].at < h[j].at
	}
	return h[i].seq < h[j].seq
}
func (h eventHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *eventHeap) Push(x any)   { *h = append(*h, x.(*event)) }
func (h *eventHeap) Pop() any {
	old := *h
	n := len(old)
	e := old[n-1]
	old[n-1] = nil
	*h = old[:n-1]
	return e
}

// scheduler is the one source of order and chance in a run: a seeded
// random generator and a queue of events ordered by (tick, scheduling
// order). Every event it runs is named, and the names, with their ticks,
// make the trace whose hash the summary line reports.
type scheduler struct {
	rng    *rand.Rand
	now    Tick
	seq    uint64
	queue  eventHeap
	events int
	trace  *xxhash.Digest
	// keep records every event's trace line (for printing a failing run).
	keep  bool
	lines []string
	buf   []byte
}

func newScheduler(seed uint64, keep bool) *scheduler {
	return &scheduler{
		rng:   rand.New(rand.NewPCG(seed, seed^0x7e57_5eed_0bad_cafe)),
		trace: xxhash.New(),
		keep:  keep,
	}
}

// after schedules fn to run delay ticks from now.
func (s *scheduler) after(delay Tick, name string, fn func()) {
	s.seq++
	heap.Push(&s.queue, &event{at: s.now + delay, seq: s.seq, name: name, fn: fn})
}

// step runs the next event; false when none is left.
func (s *scheduler) step() bool {
	if len(s.queue) == 0 {
		return false
	}
	e := heap.Pop(&s.queue).(*event)
	s.now = e.at
	s.record(e.name)
	e.fn()
	return true
}

// record adds a line to the trace.
func (s *scheduler) record(name string) {
	s.events++
	s.buf = strconv.AppendUint(s.buf[:0], uint64(s.now), 10)
	s.buf = append(s.buf, ' ')
	s.buf = append(s.buf, name...)
	s.buf = append(s.buf, '\n')
	s.trace.Write(s.buf)
	if s.keep {
		s.lines = append(s.lines, string(s.buf[:len(s.buf)-1]))
	}
}

// note records something that happened inside an event (a fault, a
// decision) in the trace.
func (s *scheduler) note(format string, args ...any) {
	s.record(fmt.Sprintf(format, args...))
	s.events-- // a note is part of its event, not an event
}

// chance reports true with probability p.
func (s *scheduler) chance(p float64) bool { return p > 0 && s.rng.Float64() < p }

// between returns a tick count in [lo, hi].
func (s *scheduler) between(lo, hi Tick) Tick { return lo + Tick(s.rng.Uint64N(uint64(hi-lo+1))) }

// intn returns an int in [0, n).
func (s *scheduler) intn(n int) int { return s.rng.IntN(n) }

// hash returns the hash of the trace so far.
func (s *scheduler) hash() uint64 { return s.trace.Sum64() }
