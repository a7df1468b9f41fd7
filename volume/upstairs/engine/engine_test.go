package engine

import (
	"errors"
	"slices"
	"testing"

	"tern/volume/ids"
	"tern/volume/wire"
)

// harness drives an engine like the driver does and records what it says.
type harness struct {
	t         *testing.T
	e         *Engine
	completed map[wire.JobID]error
	retired   map[wire.JobID]bool
	privatize []wire.JobID
	repairs   []Action
	rewrites  map[wire.JobID]wire.JobID // child -> parent
	woken     [ReplicaCount]int
}

func newHarness(t *testing.T, limits Limits) *harness {
	t.Helper()
	if limits == (Limits{}) {
		limits = Limits{BacklogJobs: 8, BacklogBytes: 1 << 20, InflightJobs: 64, InflightBytes: 8 << 20}
	}
	h := &harness{t: t, e: New(limits), completed: map[wire.JobID]error{}, retired: map[wire.JobID]bool{}, rewrites: map[wire.JobID]wire.JobID{}}
	h.e.Activate([ReplicaCount]bool{true, true, true}, 1)
	h.drain()
	return h
}

func (h *harness) drain() {
	for {
		acts := h.e.TakeActions()
		if len(acts) == 0 {
			return
		}
		for _, a := range acts {
			switch a.Kind {
			case ActComplete:
				if _, dup := h.completed[a.ID]; dup {
					h.t.Fatalf("job %d completed twice", a.ID)
				}
				h.completed[a.ID] = a.Err
			case ActRetire:
				h.retired[a.ID] = true
			case ActPrivatize:
				h.privatize = append(h.privatize, a.ID)
			case ActRepairRead:
				h.repairs = append(h.repairs, a)
			case ActRewrite:
				h.rewrites[a.ID] = a.Parent
			case ActWake:
				h.woken[a.Replica]++
			}
		}
	}
}

func (h *harness) write(first, count int) wire.JobID {
	h.t.Helper()
	id, err := h.e.SubmitWrite(ids.BlockIndex(first), uint32(count), count*4096)
	if err != nil {
		h.t.Fatalf("submitWrite: %v", err)
	}
	h.drain()
	return id
}

func (h *harness) read(first, count int) wire.JobID {
	h.t.Helper()
	id, err := h.e.SubmitRead(ids.BlockIndex(first), uint32(count), count*4096)
	if err != nil {
		h.t.Fatalf("submitRead: %v", err)
	}
	h.drain()
	return id
}

// send takes every queued job of replica r as its driver would and returns
// the IDs with the dependencies that went on the wire.
func (h *harness) send(r int) (ids []wire.JobID, deps map[wire.JobID][]wire.JobID) {
	deps = map[wire.JobID][]wire.JobID{}
	for {
		j, ok := h.e.TakeNext(r)
		if !ok {
			break
		}
		ids = append(ids, j.ID)
		deps[j.ID] = h.e.SendDeps(nil, j, r)
		h.e.Sent(r, j.ID)
		h.drain()
	}
	return ids, deps
}

func (h *harness) done(r int, id wire.JobID) {
	h.e.Done(r, id)
	h.drain()
}

func (h *harness) mustComplete(id wire.JobID, want error) {
	h.t.Helper()
	err, ok := h.completed[id]
	if !ok {
		h.t.Fatalf("job %d not completed", id)
	}
	if !errors.Is(err, want) {
		h.t.Fatalf("job %d completed with %v, want %v", id, err, want)
	}
}

func (h *harness) mustPend(id wire.JobID) {
	h.t.Helper()
	if err, ok := h.completed[id]; ok {
		h.t.Fatalf("job %d completed early (%v)", id, err)
	}
}

func TestWriteAcksAtTwoAndPrivatizesForTheThird(t *testing.T) {
	h := newHarness(t, Limits{})
	w := h.write(0, 4)
	for r := range 3 {
		h.send(r)
	}
	h.done(0, w)
	h.mustPend(w)
	h.done(1, w)
	// The third replica still needs the data: copy it before the caller
	// gets its buffer back.
	h.mustPend(w)
	if !slices.Equal(h.privatize, []wire.JobID{w}) {
		t.Fatalf("privatize = %v, want [%d]", h.privatize, w)
	}
	h.e.Privatized(w, true)
	h.drain()
	h.mustComplete(w, nil)
	if h.retired[w] {
		t.Fatal("retired before the third replica answered")
	}
	h.done(2, w)
	if !h.retired[w] {
		t.Fatal("not retired after all replicas answered")
	}
}

func TestWriteDoneEverywhereNeedsNoCopy(t *testing.T) {
	h := newHarness(t, Limits{})
	w := h.write(0, 1)
	for r := range 3 {
		h.send(r)
		h.done(r, w)
	}
	// Completion waits for... nothing: the first two acks came while the
	// third was still pending, so a copy was asked for.
	if len(h.privatize) != 1 {
		t.Fatalf("privatize = %v", h.privatize)
	}
	h.e.Privatized(w, true)
	h.drain()
	h.mustComplete(w, nil)
	if !h.retired[w] {
		t.Fatal("not retired")
	}
}

// TestLaggingReplicaWaitsWhileAWriteIsPrivatized: a replica that had not
// taken a write when its peers applied it must not start sending it while
// its data is copied out of the caller's buffer (the copy runs with the
// driver's lock released); it is woken once the copy is in place, and
// the write still counts as its next job, so no call overtakes it.
func TestLaggingReplicaWaitsWhileAWriteIsPrivatized(t *testing.T) {
	h := newHarness(t, Limits{})
	w := h.write(0, 2)
	h.send(0)
	h.send(1)
	h.done(0, w)
	h.done(1, w)
	if !slices.Equal(h.privatize, []wire.JobID{w}) {
		t.Fatalf("privatize = %v, want [%d]", h.privatize, w)
	}
	if j, ok := h.e.TakeNext(2); ok {
		t.Fatalf("replica 2 took job %d while it was being privatized", j.ID)
	}
	if next := h.e.NextJobID(2); next != w {
		t.Fatalf("replica 2's next job is %d, want the privatizing write %d", next, w)
	}
	woken := h.woken[2]
	h.e.Privatized(w, true)
	h.drain()
	h.mustComplete(w, nil)
	if h.woken[2] == woken {
		t.Fatal("replica 2 not woken after the copy")
	}
	if ids, _ := h.send(2); !slices.Equal(ids, []wire.JobID{w}) {
		t.Fatalf("replica 2 sent %v after the copy, want [%d]", ids, w)
	}
}

func TestWriteWaitsWhileItsDataIsBeingSent(t *testing.T) {
	h := newHarness(t, Limits{})
	w := h.write(0, 1)
	h.send(0)
	h.send(1)
	j, _ := h.e.TakeNext(2) // replica 2 is writing from the caller's buffer
	h.done(0, w)
	h.done(1, w)
	if len(h.privatize) != 0 {
		t.Fatal("privatize while a send reads the caller's buffer")
	}
	h.mustPend(w)
	h.e.Sent(2, j.ID)
	h.drain()
	if len(h.privatize) != 1 {
		t.Fatal("no privatize after the send finished")
	}
}

func TestDependenciesFollowOverlapAndKind(t *testing.T) {
	h := newHarness(t, Limits{})
	w1 := h.write(0, 4)
	w2 := h.write(8, 4)  // no overlap with w1
	r1 := h.read(3, 1)   // overlaps w1
	w3 := h.write(3, 6)  // overlaps w1, w2 and (if on the same replica) r1
	f := mustFlush(t, h) // everything
	r2 := h.read(100, 1) // nothing
	readReplica := -1
	for r := range 3 {
		ids, deps := h.send(r)
		if slices.Contains(ids, r1) {
			readReplica = r
		}
		check := func(id wire.JobID, want ...wire.JobID) {
			t.Helper()
			if !slices.Contains(ids, id) {
				return
			}
			if !slices.Equal(deps[id], want) {
				t.Errorf("replica %d job %d deps = %v, want %v", r, id, deps[id], want)
			}
		}
		check(w1)
		check(w2)
		check(r1, w1)
		if slices.Contains(ids, r1) {
			check(w3, w1, w2, r1)
			check(f, w1, w2, r1, w3)
		} else {
			check(w3, w1, w2)
			check(f, w1, w2, w3)
		}
		check(r2)
	}
	if readReplica < 0 {
		t.Fatal("read never sent")
	}
}

func mustFlush(t *testing.T, h *harness) wire.JobID {
	t.Helper()
	id, err := h.e.SubmitFlush()
	if err != nil {
		t.Fatalf("submitFlush: %v", err)
	}
	h.drain()
	return id
}

func TestReadGoesToLeastLoadedReplica(t *testing.T) {
	h := newHarness(t, Limits{})
	// Load replicas 0 and 1 with a read each; the next read goes to 2.
	a := h.read(0, 1)
	b := h.read(1, 1)
	c := h.read(2, 1)
	seen := map[int]bool{}
	for r := range 3 {
		ids, _ := h.send(r)
		if len(ids) != 1 {
			t.Fatalf("replica %d got %v, want one read", r, ids)
		}
		seen[r] = true
	}
	_ = []wire.JobID{a, b, c}
	if len(seen) != 3 {
		t.Fatal("reads not spread")
	}
}

func TestBadReadRetriesElsewhereAndOffersRepair(t *testing.T) {
	h := newHarness(t, Limits{})
	rd := h.read(5, 2)
	var first int
	for r := range 3 {
		if ids, _ := h.send(r); len(ids) == 1 {
			first = r
		}
	}
	if !h.e.ReadBegin(first, rd) {
		t.Fatal("readBegin refused")
	}
	h.e.ReadResult(first, rd, ReadBadData)
	h.drain()
	h.mustPend(rd)
	second := -1
	for r := range 3 {
		if ids, _ := h.send(r); len(ids) == 1 {
			second = r
		}
	}
	if second < 0 || second == first {
		t.Fatalf("retried on %d after bad data from %d", second, first)
	}
	h.e.ReadBegin(second, rd)
	h.e.ReadResult(second, rd, ReadGood)
	h.drain()
	h.mustComplete(rd, nil)
	if len(h.repairs) != 1 || h.repairs[0].Replica != first {
		t.Fatalf("repairs = %+v, want replica %d", h.repairs, first)
	}
	// The repair write goes to the bad replica only.
	rep, ok := h.e.SubmitRepair(first, rd, 5, 2, 8192)
	if !ok {
		t.Fatal("submitRepair refused")
	}
	h.drain()
	for r := range 3 {
		ids, _ := h.send(r)
		if got := slices.Contains(ids, rep); got != (r == first) {
			t.Errorf("replica %d got repair = %v", r, got)
		}
	}
}

func TestRepairRefusedAfterNewerOverlappingWrite(t *testing.T) {
	h := newHarness(t, Limits{})
	rd := h.read(5, 2)
	h.write(6, 1)
	if _, ok := h.e.SubmitRepair(0, rd, 5, 2, 8192); ok {
		t.Fatal("repair accepted over a newer write")
	}
}

func TestCorruptEverywhereFailsRead(t *testing.T) {
	h := newHarness(t, Limits{})
	rd := h.read(0, 1)
	for range 3 {
		for r := range 3 {
			if ids, _ := h.send(r); len(ids) == 1 {
				h.e.ReadBegin(r, rd)
				h.e.ReadResult(r, rd, ReadBadData)
				h.drain()
			}
		}
	}
	h.mustComplete(rd, ErrCorrupt)
}

func TestOfflineReplicaReplaysBacklogInOrder(t *testing.T) {
	h := newHarness(t, Limits{})
	w1 := h.write(0, 1)
	for r := range 3 {
		h.send(r)
	}
	h.e.Disconnected(2)
	h.drain()
	w2 := h.write(0, 1)
	h.send(0)
	h.send(1)
	for _, w := range []wire.JobID{w1, w2} {
		h.done(0, w)
		h.done(1, w)
		h.e.Privatized(w, true)
		h.drain()
		h.mustComplete(w, nil)
	}
	if ids, _ := h.send(2); len(ids) != 0 {
		t.Fatalf("offline replica sent %v", ids)
	}
	h.e.Connected(2)
	h.drain()
	ids, deps := h.send(2)
	if !slices.Equal(ids, []wire.JobID{w1, w2}) {
		t.Fatalf("replayed %v, want [%d %d]", ids, w1, w2)
	}
	if !slices.Equal(deps[w2], []wire.JobID{w1}) {
		t.Fatalf("replayed w2 deps %v, want [%d]", deps[w2], w1)
	}
	h.done(2, w2)
	// w2 depended on w1 there, so w1 was applied too: nothing to replay.
	if !h.retired[w1] || !h.retired[w2] {
		t.Fatal("jobs not retired after replay")
	}
}

func TestAckOfLaterWriteImpliesItsDependencies(t *testing.T) {
	h := newHarness(t, Limits{})
	w1 := h.write(0, 1)
	w2 := h.write(0, 1)
	h.send(0)
	h.done(0, w2) // w1's reply was lost
	if got := h.e.jobs[w1].slot[0]; got != slotDone {
		t.Fatalf("w1 on replica 0 = %v, want done", got)
	}
}

func TestBacklogOverflowFaultsOfflineReplica(t *testing.T) {
	h := newHarness(t, Limits{BacklogJobs: 3, BacklogBytes: 1 << 30, InflightJobs: 100, InflightBytes: 1 << 30})
	h.e.Disconnected(1)
	h.drain()
	var ws []wire.JobID
	for i := range 4 {
		ws = append(ws, h.write(i, 1))
	}
	if st := h.e.replicas[1].state; st != ReplicaFaulted {
		t.Fatalf("replica 1 = %v, want faulted", st)
	}
	if h.e.replicas[1].owedJobs != 0 {
		t.Fatalf("faulted replica owes %d jobs", h.e.replicas[1].owedJobs)
	}
	// IO continues on the other two, and the faulted one gets nothing.
	w := h.write(10, 1)
	if h.e.jobs[w].slot[1] != slotNone {
		t.Fatal("faulted replica was given a job")
	}
	_ = ws
}

func TestWriteFailsWithFewerThanTwoReplicas(t *testing.T) {
	h := newHarness(t, Limits{})
	w := h.write(0, 1)
	h.e.Fault(0)
	h.e.Fault(1)
	h.drain()
	// The remaining replica still needs the data; then the write fails.
	if len(h.privatize) != 1 {
		t.Fatalf("privatize = %v", h.privatize)
	}
	h.e.Privatized(w, true)
	h.drain()
	h.mustComplete(w, ErrNotEnoughReplicas)
	if _, err := h.e.SubmitWrite(0, 1, 4096); !errors.Is(err, ErrNotEnoughReplicas) {
		t.Fatalf("submitWrite = %v, want ErrNotEnoughReplicas", err)
	}
	// Reads still work from the one replica.
	h.read(0, 1)
}

func TestTornWriteIsRewrittenToAllReplicas(t *testing.T) {
	h := newHarness(t, Limits{})
	w := h.write(0, 2)
	for r := range 3 {
		h.send(r)
	}
	h.done(0, w)
	h.e.Rejected(1, w) // the caller changed the buffer in flight
	h.drain()
	h.done(2, w)
	if !slices.Equal(h.privatize, []wire.JobID{w}) {
		t.Fatalf("privatize = %v", h.privatize)
	}
	h.mustPend(w)
	h.e.Privatized(w, false)
	h.drain()
	var child wire.JobID
	for c, p := range h.rewrites {
		if p == w {
			child = c
		}
	}
	if child == 0 {
		t.Fatal("no rewrite")
	}
	h.mustPend(w)
	for r := range 3 {
		ids, deps := h.send(r)
		if !slices.Equal(ids, []wire.JobID{child}) {
			t.Fatalf("replica %d sent %v, want the rewrite", r, ids)
		}
		if len(deps[child]) != 0 {
			t.Fatalf("rewrite deps %v on replica %d, want none (w settled)", deps[child], r)
		}
	}
	h.done(0, child)
	h.mustPend(w)
	h.done(2, child)
	h.mustComplete(w, nil)
	h.done(1, child)
	if !h.retired[w] || !h.retired[child] {
		t.Fatal("not retired")
	}
}

func TestRewriteFollowsConcurrentOverlappingWrite(t *testing.T) {
	h := newHarness(t, Limits{})
	w := h.write(0, 2)
	later := h.write(1, 1) // submitted while w is in flight
	for r := range 3 {
		h.send(r)
	}
	h.e.Rejected(0, w)
	h.drain()
	h.e.Privatized(w, false)
	h.drain()
	var child wire.JobID
	for c := range h.rewrites {
		child = c
	}
	for r := range 3 {
		_, deps := h.send(r)
		want := []wire.JobID{later}
		if r != 0 {
			want = []wire.JobID{w, later}
		}
		if !slices.Equal(deps[child], want) {
			t.Fatalf("replica %d rewrite deps = %v, want %v", r, deps[child], want)
		}
	}
}

func TestAbandonedReadReleasedOnlyAfterReceive(t *testing.T) {
	h := newHarness(t, Limits{})
	rd := h.read(0, 1)
	var at int
	for r := range 3 {
		if ids, _ := h.send(r); len(ids) == 1 {
			at = r
		}
	}
	if !h.e.ReadBegin(at, rd) {
		t.Fatal("readBegin refused")
	}
	h.e.Abandon(rd)
	h.drain()
	h.mustPend(rd) // data is landing in the caller's buffer right now
	h.e.ReadResult(at, rd, ReadGood)
	h.drain()
	h.mustComplete(rd, ErrAbandoned)
	if !h.retired[rd] {
		t.Fatal("not retired")
	}
}

func TestAbandonedReadDiscardsLateData(t *testing.T) {
	h := newHarness(t, Limits{})
	rd := h.read(0, 1)
	var at int
	for r := range 3 {
		if ids, _ := h.send(r); len(ids) == 1 {
			at = r
		}
	}
	h.e.Abandon(rd)
	h.drain()
	h.mustComplete(rd, ErrAbandoned)
	if h.e.ReadBegin(at, rd) {
		t.Fatal("late data allowed into an abandoned caller's buffer")
	}
	h.e.ReadResult(at, rd, ReadFailed)
	h.drain()
	if !h.retired[rd] {
		t.Fatal("not retired")
	}
}

func TestDisconnectMovesReadsElsewhere(t *testing.T) {
	h := newHarness(t, Limits{})
	rd := h.read(0, 1)
	var at int
	for r := range 3 {
		if ids, _ := h.send(r); len(ids) == 1 {
			at = r
		}
	}
	h.e.Disconnected(at)
	h.drain()
	if !h.readMovedFrom(rd, at) {
		t.Fatal("read not rerouted")
	}
}

// readMovedFrom sends every replica's queue and reports whether read rd
// went to a replica other than at.
func (h *harness) readMovedFrom(rd wire.JobID, at int) bool {
	moved := false
	for r := range 3 {
		if ids, _ := h.send(r); slices.Equal(ids, []wire.JobID{rd}) {
			moved = r != at
		}
	}
	return moved
}

// TestReadBeingSentWhenItsReplicaFaultsMovesElsewhere: a replica faulted
// while its driver is still writing a read's request (a protocol
// violation noticed on its reply stream meanwhile) settles that read once
// the driver reports the send, and the read goes to a peer; it does not
// wait for a replica that will never answer it.
func TestReadBeingSentWhenItsReplicaFaultsMovesElsewhere(t *testing.T) {
	h := newHarness(t, Limits{})
	rd := h.read(0, 1)
	at := -1
	for r := range 3 {
		if j, ok := h.e.TakeNext(r); ok {
			at = r
			if j.ID != rd {
				t.Fatalf("replica %d took job %d, want the read %d", r, j.ID, rd)
			}
		}
	}
	if at < 0 {
		t.Fatal("no replica took the read")
	}
	h.e.Fault(at) // the driver is still sending
	h.drain()
	h.e.Sent(at, rd)
	h.drain()
	if !h.readMovedFrom(rd, at) {
		t.Fatalf("the read sent to replica %d when it faulted was not rerouted", at)
	}
}

func TestReadParksWhileAllReplicasOffline(t *testing.T) {
	h := newHarness(t, Limits{})
	for r := range 3 {
		h.e.Disconnected(r)
	}
	h.drain()
	rd := h.read(0, 1)
	for r := range 3 {
		if ids, _ := h.send(r); len(ids) != 0 {
			t.Fatalf("sent %v to offline replica", ids)
		}
	}
	h.e.Connected(1)
	h.drain()
	if ids, _ := h.send(1); !slices.Equal(ids, []wire.JobID{rd}) {
		t.Fatalf("replica 1 sent %v after reconnect, want the parked read", ids)
	}
}

func TestFlushAcksAtTwo(t *testing.T) {
	h := newHarness(t, Limits{})
	f := mustFlush(t, h)
	f2 := mustFlush(t, h)
	if h.e.jobs[f].FlushNumber+1 != h.e.jobs[f2].FlushNumber {
		t.Fatal("flush numbers not consecutive")
	}
	for r := range 3 {
		h.send(r)
	}
	h.done(0, f)
	h.mustPend(f)
	h.done(1, f)
	h.mustComplete(f, nil)
}

// errTestStop is what the tests stop the engine with (a driver passes its
// own reason, ErrFenced or ErrClosed).
var errTestStop = errors.New("stopped by the test")

func TestStopFailsEverythingButWaitsForBusyBuffers(t *testing.T) {
	h := newHarness(t, Limits{})
	w := h.write(0, 1)
	j, _ := h.e.TakeNext(0)
	h.e.Stop(errTestStop)
	h.drain()
	h.mustPend(w) // replica 0's driver still reads the caller's buffer
	h.e.Sent(0, j.ID)
	h.drain()
	h.mustComplete(w, errTestStop)
	if !h.retired[w] {
		t.Fatal("not retired")
	}
	if _, err := h.e.SubmitRead(0, 1, 4096); !errors.Is(err, errTestStop) {
		t.Fatalf("submitRead after stop = %v", err)
	}
}

func TestBackpressureCountsLiveJobs(t *testing.T) {
	h := newHarness(t, Limits{BacklogJobs: 10, BacklogBytes: 1 << 30, InflightJobs: 2, InflightBytes: 1 << 30})
	h.write(0, 1)
	if h.e.Full(4096) {
		t.Fatal("full after one job")
	}
	h.write(1, 1)
	if !h.e.Full(4096) {
		t.Fatal("not full after two jobs")
	}
}

func TestFaultedReplicaRepairSeam(t *testing.T) {
	h := newHarness(t, Limits{})
	h.e.Fault(2)
	h.drain()
	w := h.write(0, 1)
	if h.e.jobs[w].slot[2] != slotNone {
		t.Fatal("faulted replica got IO")
	}
	if !h.e.RepairStarted(2) || !h.e.RepairDone(2) {
		t.Fatal("repair seam refused")
	}
	w2 := h.write(0, 1)
	if h.e.jobs[w2].slot[2] != slotQueued {
		t.Fatal("repaired replica gets no IO")
	}
}

// A replica that applied writes and a flush, then lost the replies with
// its connection, reports the flush on its extents when it rejoins: only
// what came after the flush is replayed, so a replay cut short cannot
// leave it older than its flushed state (found by volume/sim).
func TestRejoinDoesNotReplayWhatTheReplicaFlushed(t *testing.T) {
	h := newHarness(t, Limits{})
	w1 := h.write(0, 1)
	f := mustFlush(t, h)
	w2 := h.write(0, 1)
	for r := range 3 {
		h.send(r)
	}
	for _, id := range []wire.JobID{w1, f, w2} {
		h.done(0, id)
		h.done(1, id)
	}
	for _, id := range h.privatize {
		h.e.Privatized(id, true)
	}
	h.drain()
	// Replica 2 ran all three, but its replies were lost.
	h.e.Disconnected(2)
	h.drain()
	flushNumber := h.e.jobs[f].FlushNumber
	h.e.FlushedOn(2, flushNumber)
	h.drain()
	h.e.Connected(2)
	h.drain()
	ids, _ := h.send(2)
	if !slices.Equal(ids, []wire.JobID{w2}) {
		t.Fatalf("replayed %v, want only [%d] (after flush %d)", ids, w2, f)
	}
}

// TestJobsSkippedDuringRepairCountTheRepairedReplica: a write and a flush
// submitted while replica 1 is faulted reach only replicas 0 and 2; 1 is
// repaired (the copy brings the write) and makes a later flush durable;
// then 2 dies before answering. The write and the flush are held by two
// Active replicas, 0 and 1, and must complete, not wait for 2.
func TestJobsSkippedDuringRepairCountTheRepairedReplica(t *testing.T) {
	h := newHarness(t, Limits{})
	h.e.Fault(1)
	h.drain()
	w := h.write(0, 4)
	f, err := h.e.SubmitFlush()
	if err != nil {
		t.Fatal(err)
	}
	h.drain()
	h.send(0)
	h.send(2)
	h.done(0, w)
	h.done(0, f)
	h.mustPend(w)
	h.mustPend(f)
	if !h.e.RepairStarted(1) || !h.e.RepairDone(1) {
		t.Fatal("replica 1 did not go through repair")
	}
	h.drain()
	p, err := h.e.SubmitFlush()
	if err != nil {
		t.Fatal(err)
	}
	h.drain()
	h.send(0)
	h.send(1)
	h.done(0, p)
	h.done(1, p)
	h.e.Disconnected(2)
	h.drain()
	for _, id := range h.privatize {
		h.e.Privatized(id, true)
		h.drain()
	}
	h.mustComplete(w, nil)
	h.mustComplete(f, nil)
	h.mustComplete(p, nil)
}
