package engine

import (
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"testing"

	"tern/volume/ids"
	"tern/volume/wire"
)

// The simulation runs the engine against three in-memory downstairs that
// behave like the real one (requests run in arrival order, replies come
// back in order on the same connection, a lost connection loses whatever
// was in flight), with random timing, disconnects, callers that change
// their buffers in flight and callers that give up. It checks the promises
// of doc.go: replicas never diverge, and a read returns only what the most
// recent acknowledged write or a write still in flight put there.

const simBlocks = 16

var simTrace = os.Getenv("SIM_TRACE") != ""

type simMsg struct {
	id       wire.JobID
	kind     JobKind
	first    int
	count    int
	data     uint64 // a write's block content (all blocks alike)
	hash     uint64 // the hash it was sent with
	mismatch bool   // reply: hash mismatch
	values   []uint64
}

type simReplica struct {
	blocks    [simBlocks]uint64
	connected bool
	inbox     []simMsg
	replies   []simMsg
}

type simWrite struct {
	first   int
	count   int
	hash    uint64   // value the caller's buffer had when hashed
	buf     uint64   // value the caller's buffer has now
	seen    []uint64 // every value the caller's buffer had
	priv    uint64   // private copy
	hasPriv bool
	parent  wire.JobID
	child   wire.JobID
	failed  bool // completed with an error: its data may or may not land
}

type simRead struct {
	first, count int
	allowed      []map[uint64]bool
}

type sim struct {
	t       *testing.T
	rng     *rand.Rand
	e       *Engine
	reps    [ReplicaCount]simReplica
	writes  map[wire.JobID]*simWrite
	reads   map[wire.JobID]*simRead
	pending map[wire.JobID]bool // caller jobs not yet completed
	acked   [simBlocks]struct {
		id    wire.JobID
		value uint64
	}
	nextVal uint64
	sending [ReplicaCount][]wire.JobID
	// privatizing are writes whose private copy the driver is making:
	// like the real driver, which copies with the lock released, the
	// simulation lets other steps run before the copy is done.
	privatizing []wire.JobID
	faults      int
	complete    int
}

func newSim(t *testing.T, seed uint64, limits Limits) *sim {
	s := &sim{
		t: t, rng: rand.New(rand.NewPCG(seed, seed^0x5eed)), e: New(limits),
		writes: map[wire.JobID]*simWrite{}, reads: map[wire.JobID]*simRead{}, pending: map[wire.JobID]bool{},
		nextVal: 1,
	}
	for r := range s.reps {
		s.reps[r].connected = true
	}
	s.e.Activate([ReplicaCount]bool{true, true, true}, 1)
	s.drain()
	return s
}

func (s *sim) fatalf(format string, args ...any) {
	s.t.Helper()
	s.t.Fatalf(format, args...)
}

func (s *sim) drain() {
	for {
		acts := s.e.TakeActions()
		if len(acts) == 0 {
			return
		}
		for _, a := range acts {
			switch a.Kind {
			case ActComplete:
				s.completed(a.ID, a.Err)
			case ActPrivatize:
				s.privatizing = append(s.privatizing, a.ID)
			case ActRewrite:
				p := s.writes[a.Parent]
				if simTrace {
					s.t.Logf("rewrite %d of %d value %d", a.ID, a.Parent, p.priv)
				}
				p.child = a.ID
				s.writes[a.ID] = &simWrite{first: p.first, count: p.count, hash: p.priv, buf: p.priv, priv: p.priv, hasPriv: true, parent: a.Parent, seen: []uint64{p.priv}}
			case ActRepairRead:
				s.fatalf("repair offered without corruption")
			case ActState:
				if a.State == ReplicaFaulted {
					s.faults++
				}
			}
		}
	}
}

// finishPrivatize ends the copy of one write being privatized.
func (s *sim) finishPrivatize() {
	if len(s.privatizing) == 0 {
		return
	}
	i := s.rng.IntN(len(s.privatizing))
	id := s.privatizing[i]
	s.privatizing = slices.Delete(s.privatizing, i, i+1)
	w := s.writes[id]
	if simTrace {
		s.t.Logf("privatize %d buf %d hash %d", id, w.buf, w.hash)
	}
	w.priv, w.hasPriv = w.buf, true
	s.e.Privatized(id, w.buf == w.hash)
	s.drain()
}

func (s *sim) completed(id wire.JobID, err error) {
	if !s.pending[id] {
		s.fatalf("job %d completed twice or never submitted", id)
	}
	if j, ok := s.e.jobs[id]; ok {
		for r := range ReplicaCount {
			if j.sending[r] && j.fromCaller[r] {
				s.fatalf("job %d completed while replica %d still sends it from the caller's buffer", id, r)
			}
		}
	}
	delete(s.pending, id)
	s.complete++
	w, ok := s.writes[id]
	if !ok {
		return
	}
	if err != nil {
		w.failed = true
		return
	}
	// An acknowledged write's range now reads as the value the replicas
	// agreed on: its private copy if it has one (a torn write's rewrite
	// carries it; otherwise it equals the hashed value), else the hashed
	// value.
	v := w.hash
	if w.hasPriv {
		v = w.priv
	}
	// Replicas order it by its rewrite's ID if it has one.
	order := max(id, w.child)
	for b := w.first; b < w.first+w.count; b++ {
		if s.acked[b].id < order {
			s.acked[b].id, s.acked[b].value = order, v
		}
	}
}

func (s *sim) submitWrite() {
	first := s.rng.IntN(simBlocks)
	count := 1 + s.rng.IntN(min(4, simBlocks-first))
	id, err := s.e.SubmitWrite(ids.BlockIndex(first), uint32(count), count*4096)
	if err != nil {
		return
	}
	v := s.nextVal
	s.nextVal++
	if simTrace {
		j := s.e.jobs[id]
		s.t.Logf("submit write %d slots %v", id, j.slot)
	}
	s.writes[id] = &simWrite{first: first, count: count, hash: v, buf: v, seen: []uint64{v}}
	s.pending[id] = true
	s.drain()
}

func (s *sim) submitRead() {
	first := s.rng.IntN(simBlocks)
	count := 1 + s.rng.IntN(min(4, simBlocks-first))
	id, err := s.e.SubmitRead(ids.BlockIndex(first), uint32(count), count*4096)
	if err != nil {
		return
	}
	rd := &simRead{first: first, count: count}
	for b := first; b < first+count; b++ {
		allowed := map[uint64]bool{s.acked[b].value: true}
		for wid, w := range s.writes {
			if w.failed && max(wid, w.child) > s.acked[b].id && w.first <= b && b < w.first+w.count {
				for _, v := range w.seen {
					allowed[v] = true
				}
			}
		}
		for wid := range s.pending {
			if w, ok := s.writes[wid]; ok && w.first <= b && b < w.first+w.count {
				for _, v := range w.seen {
					allowed[v] = true
				}
			}
		}
		rd.allowed = append(rd.allowed, allowed)
	}
	s.reads[id] = rd
	if simTrace {
		s.t.Logf("submit read %d [%d,%d) slots %v deps %v", id, first, first+count, s.e.jobs[id].slot, s.e.jobs[id].deps)
	}
	s.pending[id] = true
	s.drain()
}

func (s *sim) submitFlush() {
	id, err := s.e.SubmitFlush()
	if err != nil {
		return
	}
	if simTrace {
		s.t.Logf("submit flush %d", id)
	}
	s.pending[id] = true
	s.drain()
}

func (s *sim) pendingIDs() []wire.JobID {
	ids := make([]wire.JobID, 0, len(s.pending))
	for id := range s.pending {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// tear changes the caller's buffer of an in-flight write.
func (s *sim) tear() {
	for _, id := range s.pendingIDs() {
		if w, ok := s.writes[id]; ok && !w.hasPriv && w.parent == 0 {
			w.buf = s.nextVal
			s.nextVal++
			if simTrace {
				s.t.Logf("tear %d: buf %d", id, w.buf)
			}
			w.seen = append(w.seen, w.buf)
			return
		}
	}
}

func (s *sim) abandon() {
	ids := s.pendingIDs()
	if len(ids) == 0 {
		return
	}
	id := ids[s.rng.IntN(len(ids))]
	if simTrace {
		s.t.Logf("abandon %d", id)
	}
	s.e.Abandon(id)
	s.drain()
}

// startSend takes the next job of r; finishSend completes the oldest.
func (s *sim) startSend(r int) {
	if !s.reps[r].connected {
		return
	}
	j, ok := s.e.TakeNext(r)
	if !ok {
		return
	}
	m := simMsg{id: j.ID, kind: j.Kind, first: int(j.First), count: int(j.Count)}
	if simTrace {
		s.t.Logf("send %d to replica %d (queue %d)", j.ID, r, s.e.replicas[r].queue.len())
	}
	if j.Kind == KindWrite {
		w := s.writes[j.ID]
		if w == nil {
			// A read repair is not simulated; nothing else lacks a record.
			s.fatalf("write %d has no record", j.ID)
		}
		m.hash = w.hash
		if j.fromCaller[r] {
			m.data = w.buf
		} else {
			m.data, m.hash = w.priv, w.priv
		}
	}
	s.reps[r].inbox = append(s.reps[r].inbox, m)
	s.sending[r] = append(s.sending[r], j.ID)
}

func (s *sim) finishSend(r int) {
	if len(s.sending[r]) == 0 {
		return
	}
	id := s.sending[r][0]
	s.sending[r] = s.sending[r][1:]
	s.e.Sent(r, id)
	s.drain()
}

// execute runs r's oldest request.
func (s *sim) execute(r int) {
	rep := &s.reps[r]
	if len(rep.inbox) == 0 {
		return
	}
	m := rep.inbox[0]
	rep.inbox = rep.inbox[1:]
	switch m.kind {
	case KindWrite:
		if simTrace {
			s.t.Logf("replica %d runs write %d [%d,%d) data %d hash %d", r, m.id, m.first, m.first+m.count, m.data, m.hash)
		}
		if m.data != m.hash {
			m.mismatch = true
		} else {
			for b := m.first; b < m.first+m.count; b++ {
				rep.blocks[b] = m.data
			}
		}
	case KindRead:
		m.values = slices.Clone(rep.blocks[m.first : m.first+m.count])
	}
	rep.replies = append(rep.replies, m)
}

// deliver hands r's oldest reply to the engine.
func (s *sim) deliver(r int) {
	rep := &s.reps[r]
	if len(rep.replies) == 0 {
		return
	}
	m := rep.replies[0]
	rep.replies = rep.replies[1:]
	switch {
	case m.kind == KindRead:
		if s.e.ReadBegin(r, m.id) {
			rd := s.reads[m.id]
			for i, v := range m.values {
				if !rd.allowed[i][v] && !s.laterWrite(m.id, rd.first+i, v) {
					s.fatalf("read %d block %d from replica %d = %d, allowed %v", m.id, rd.first+i, r, v, rd.allowed[i])
				}
			}
		}
		s.e.ReadResult(r, m.id, ReadGood)
	case m.mismatch:
		if simTrace {
			s.t.Logf("replica %d rejected %d", r, m.id)
		}
		s.e.Rejected(r, m.id)
	default:
		if simTrace {
			s.t.Logf("replica %d done %d", r, m.id)
		}
		s.e.Done(r, m.id)
	}
	s.drain()
}

// laterWrite reports whether a write submitted after read rid (so
// concurrent with it: rerouted reads may run after it) put v in block b.
func (s *sim) laterWrite(rid wire.JobID, b int, v uint64) bool {
	for wid, w := range s.writes {
		if wid > rid && w.first <= b && b < w.first+w.count && slices.Contains(w.seen, v) {
			return true
		}
	}
	return false
}

func (s *sim) disconnect(r int) {
	if !s.reps[r].connected {
		return
	}
	// The driver finishes its sends before reporting the disconnect.
	for len(s.sending[r]) > 0 {
		s.finishSend(r)
	}
	rep := &s.reps[r]
	rep.connected, rep.inbox, rep.replies = false, nil, nil
	if simTrace {
		s.t.Logf("disconnect %d", r)
	}
	s.e.Disconnected(r)
	s.drain()
}

func (s *sim) reconnect(r int) {
	if s.reps[r].connected || s.e.replicas[r].state != ReplicaOffline {
		return
	}
	s.reps[r].connected = true
	if simTrace {
		s.t.Logf("reconnect %d", r)
	}
	s.e.Connected(r)
	s.drain()
}

// checkInvariants verifies the engine's bookkeeping after every step.
func (s *sim) checkInvariants(what string) {
	for r := range ReplicaCount {
		owed, owedBytes := 0, 0
		for _, j := range s.e.order {
			st := j.slot[r]
			if st.pending() {
				owed++
				owedBytes += j.Bytes
			}
			if !s.e.replicas[r].state.takesIO() && (st == slotQueued || st == slotSent && !j.sending[r]) {
				s.fatalf("after %s: job %d slot %d on %v replica %d", what, j.ID, st, s.e.replicas[r].state, r)
			}
		}
		if owed != s.e.replicas[r].owedJobs || owedBytes != s.e.replicas[r].owedBytes {
			s.fatalf("after %s: replica %d owes %d jobs/%d bytes, counted %d/%d", what, r, s.e.replicas[r].owedJobs, s.e.replicas[r].owedBytes, owed, owedBytes)
		}
	}
}

func (s *sim) step() {
	r := s.rng.IntN(ReplicaCount)
	n := s.rng.IntN(100)
	defer s.checkInvariants(fmt.Sprintf("step %d on replica %d", n, r))
	switch {
	case n < 12:
		if !s.e.Full(4096) {
			s.submitWrite()
		}
	case n < 20:
		if !s.e.Full(4096) {
			s.submitRead()
		}
	case n < 22:
		s.submitFlush()
	case n < 24:
		s.tear()
	case n < 25:
		s.abandon()
	case n < 28:
		s.finishPrivatize()
	case n < 45:
		s.startSend(r)
	case n < 60:
		s.finishSend(r)
	case n < 78:
		s.execute(r)
	case n < 97:
		s.deliver(r)
	case n < 98:
		s.disconnect(r)
	default:
		s.reconnect(r)
	}
}

// quiesce reconnects every Offline replica and runs everything to the end;
// jobs still waiting for Faulted replicas (engine.possible counts them
// after every replica went away) get them back as the driver would.
func (s *sim) quiesce() {
	for range 4 {
		s.settle()
		if len(s.pending) == 0 && s.e.liveJobs == 0 || !s.repairFaulted() {
			return
		}
	}
}

// repairFaulted brings Faulted replicas back once nothing is in flight:
// by live repair from an Active replica (its blocks copied; the flush that
// follows credits it), or, with none Active, by a restart reconciliation
// (the first replica's blocks copied to the others, every live job
// replayed). It reports whether it did anything.
func (s *sim) repairFaulted() bool {
	src := -1
	for r := range ReplicaCount {
		if s.e.replicas[r].state == ReplicaActive {
			src = r
			break
		}
	}
	if src < 0 {
		var part [ReplicaCount]bool
		ref := -1
		for r := range ReplicaCount {
			if s.e.replicas[r].state == ReplicaStopped {
				continue
			}
			part[r] = true
			if ref < 0 {
				ref = r
			}
			s.reps[r].blocks = s.reps[max(ref, 0)].blocks
			s.reps[r].connected, s.reps[r].inbox, s.reps[r].replies = true, nil, nil
		}
		if ref < 0 {
			return false
		}
		s.e.Restarted(part, s.e.nextFlush)
		s.drain()
		return true
	}
	repaired := false
	for r := range ReplicaCount {
		if s.e.replicas[r].state != ReplicaFaulted {
			continue
		}
		s.e.RepairStarted(r)
		s.drain()
		s.reps[r].blocks = s.reps[src].blocks
		s.reps[r].connected, s.reps[r].inbox, s.reps[r].replies = true, nil, nil
		s.e.RepairDone(r)
		s.drain()
		repaired = true
	}
	if repaired {
		s.submitFlush()
	}
	return repaired
}

// settle reconnects every Offline replica and runs everything in flight
// to the end.
func (s *sim) settle() {
	for r := range ReplicaCount {
		s.reconnect(r)
	}
	for range 100000 {
		busy := len(s.privatizing) > 0
		s.finishPrivatize()
		for r := range ReplicaCount {
			for len(s.sending[r]) > 0 {
				s.finishSend(r)
				busy = true
			}
			if n := len(s.reps[r].inbox); true {
				s.startSend(r)
				busy = busy || len(s.reps[r].inbox) > n
			}
			if len(s.reps[r].inbox) > 0 {
				s.execute(r)
				busy = true
			}
			if len(s.reps[r].replies) > 0 {
				s.deliver(r)
				busy = true
			}
		}
		if !busy {
			return
		}
	}
	s.fatalf("simulation did not quiesce")
}

// simSeeds and simSteps size the sweep; SIM_SEEDS raises the seed count
// for a longer hunt.
var simSeeds, simSteps = envInt("SIM_SEEDS", 300), 600

func envInt(name string, def int) int {
	var n int
	if _, err := fmt.Sscan(os.Getenv(name), &n); err == nil && n > 0 {
		return n
	}
	return def
}

func TestEngineSimulation(t *testing.T) {
	limits := []Limits{
		{BacklogJobs: 1000, BacklogBytes: 1 << 30, InflightJobs: 64, InflightBytes: 1 << 30},
		{BacklogJobs: 6, BacklogBytes: 1 << 30, InflightJobs: 12, InflightBytes: 1 << 30},
	}
	for li, l := range limits {
		for seed := range uint64(simSeeds) {
			t.Run(fmt.Sprintf("limits%d/seed%d", li, seed), func(t *testing.T) {
				s := newSim(t, seed, l)
				for range simSteps {
					s.step()
				}
				s.quiesce()
				if len(s.pending) != 0 {
					for _, j := range s.e.order {
						t.Logf("job %d %v slots %v sending %v done %d completed %v callerMem %v priv %v torn %v aband %v parent %d child %d parked %v",
							j.ID, j.Kind, j.slot, j.sending, j.done, j.completed, j.callerMem, j.privatizing, j.torn, j.abandoned, j.parent, j.child, j.parked)
					}
					t.Logf("replicas %v %v %v", s.e.replicas[0].state, s.e.replicas[1].state, s.e.replicas[2].state)
					t.Fatalf("%d caller jobs never completed: %v", len(s.pending), s.pending)
				}
				if s.e.liveJobs != 0 || len(s.e.jobs) != 0 {
					for _, j := range s.e.order {
						t.Logf("job %d %v slots %v sending %v done %d completed %v callerMem %v priv %v torn %v aband %v parent %d child %d parked %v",
							j.ID, j.Kind, j.slot, j.sending, j.done, j.completed, j.callerMem, j.privatizing, j.torn, j.abandoned, j.parent, j.child, j.parked)
					}
					t.Logf("replicas %v %v %v", s.e.replicas[0].state, s.e.replicas[1].state, s.e.replicas[2].state)
					t.Fatalf("%d jobs never retired", s.e.liveJobs)
				}
				ref := -1
				for r := range ReplicaCount {
					if s.e.replicas[r].state != ReplicaActive {
						continue
					}
					if ref < 0 {
						ref = r
						continue
					}
					if s.reps[r].blocks != s.reps[ref].blocks {
						t.Fatalf("replicas diverged:\n%d: %v\n%d: %v", ref, s.reps[ref].blocks, r, s.reps[r].blocks)
					}
				}
			})
		}
	}
}
