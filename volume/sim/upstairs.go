package sim

import (
	"fmt"

	"github.com/cespare/xxhash/v2"
	"github.com/google/uuid"

	"tern/volume/ids"
	"tern/volume/reconcile"
	"tern/volume/upstairs"
	"tern/volume/upstairs/engine"
	"tern/volume/wire"
)

// upNode is one simulated upstairs: the real job engine (engine.Engine)
// with a driver that does, under the scheduler, what Upstairs' goroutines
// do around it (replica.go, replica_setup.go, replica_serve.go, io.go, live_repair.go): dial and activate each
// downstairs, send jobs and repair calls merged in ID order, apply
// replies, copy write data on ActPrivatize, write back good data on
// ActRepairRead, redial with backoff, and walk a Repairing replica with
// reconcile.LiveRepair.
type upNode struct {
	w      *world
	n      int
	uuid   uuid.UUID
	gen    ids.Generation
	eng    *engine.Engine
	fenced bool
	// activating: waiting for the first activation of every replica.
	activating bool
	conns      [engine.ReplicaCount]upConn
	jobs       map[wire.JobID]*ujob
	calls      map[wire.JobID]*call
	repairs    [engine.ReplicaCount]*repairWalk
	// onActivated, when set, runs instead of starting IO once every
	// replica accepted the generation (a takeover reconciles first).
	onActivated func()
	// planVersions are the extent versions a takeover planned with.
	planVersions []reconcile.ReplicaVersions
	// badSource is 1 + the replica that served bad data to a replica's
	// latest repair attempt (live_repair.go's liveRepairSlot.badSource).
	badSource [engine.ReplicaCount]int
	deps      []wire.JobID
	// held marks sessions held for a restart reconciliation, restarting
	// that one runs (restart.go).
	held       [engine.ReplicaCount]bool
	restarting bool
}

// upConn is the upstairs' side of one downstairs connection.
type upConn struct {
	epoch     uint64 // 0: not connected
	activated bool
	dialling  bool
	queue     []*call                // repair calls to send, in ID order
	sent      map[wire.JobID]msgKind // requests sent on this epoch, owed a reply
}

// ujob is the driver's record of one engine job.
type ujob struct {
	kind   engine.JobKind
	first  ids.BlockIndex
	count  uint32
	buf    []byte   // the caller's buffer (write data, read destination)
	hashes []uint64 // of a write's data
	priv   []byte   // private copy of a write's data
	caller bool     // a workload caller waits for it
	// read repair: replicas whose copy was bad, written back on success.
	repairTo []int
	// background: a flush the driver submitted itself.
	background bool
}

// call is a repair request outside the engine's jobs.
type call struct {
	id    wire.JobID
	r     int
	epoch uint64
	msg   *message
	done  func(reply *message) // nil reply: the session ended
}

func newUpNode(w *world, n int, gen ids.Generation) *upNode {
	u := &upNode{
		w: w, n: n, gen: gen,
		uuid:  uuid.UUID{0x7e, 0x51, byte(n + 1)},
		jobs:  map[wire.JobID]*ujob{},
		calls: map[wire.JobID]*call{},
		eng: engine.New(engine.Limits{
			BacklogJobs: w.cfg.BacklogJobs, BacklogBytes: w.cfg.BacklogJobs * 3 * int(w.spec.BlockSize),
			InflightJobs: w.cfg.InflightJobs, InflightBytes: w.cfg.InflightJobs * 3 * int(w.spec.BlockSize),
		}),
		activating: true,
	}
	u.eng.SetExtentBlocks(w.spec.ExtentBlocks)
	return u
}

// start dials every downstairs.
func (u *upNode) start() {
	for r := range u.conns {
		u.dial(r, 0)
	}
}

func (u *upNode) running() bool { return !u.fenced && u.eng.Running() }

// dial connects to downstairs r after delay and asks to activate.
func (u *upNode) dial(r int, delay Tick) {
	c := &u.conns[r]
	if c.dialling || u.fenced {
		return
	}
	c.dialling = true
	u.w.s.after(delay, fmt.Sprintf("u%d dial d%d", u.n, r), func() {
		c.dialling = false
		if u.fenced || c.epoch != 0 {
			return
		}
		if !u.w.ds[r].alive() || u.w.partitioned(u.n, r) {
			u.dial(r, u.w.s.between(10, 40))
			return
		}
		l := u.w.link(u.n, r)
		c.epoch = l.connect()
		c.activated = false
		c.sent = map[wire.JobID]msgKind{}
		c.queue = nil
		l.send(toDownstairs, &message{kind: mActivate, gen: u.gen, from: u.n})
	})
}

// lost handles the end of connection epoch to r (detected by the
// transport): the engine is told, calls on it fail, and r is redialled.
func (u *upNode) lost(r int, epoch uint64) {
	c := &u.conns[r]
	if c.epoch != epoch || epoch == 0 {
		return
	}
	was := c.activated
	c.epoch, c.activated, c.sent = 0, false, nil
	u.held[r] = false
	queued := c.queue
	c.queue = nil
	for _, cl := range queued {
		delete(u.calls, cl.id)
		cl.done(nil)
	}
	for _, cl := range u.calls {
		if cl.r == r && cl.epoch == epoch {
			delete(u.calls, cl.id)
			cl.done(nil)
		}
	}
	if was && u.eng.Running() {
		u.eng.Disconnected(r)
		u.apply()
	}
	u.dial(r, u.w.s.between(5, 40))
}

// drop ends the connection to r from the upstairs' side (a faulted
// replica's session ends; it redials and is repaired).
func (u *upNode) drop(r int) {
	c := &u.conns[r]
	if c.epoch == 0 {
		return
	}
	epoch := c.epoch
	u.w.link(u.n, r).sever()
	u.w.sessionGone(u.n, r)
	u.lost(r, epoch)
}

// receive handles one reply from r on epoch.
func (u *upNode) receive(r int, epoch uint64, m *message) {
	c := &u.conns[r]
	if c.epoch != epoch || u.fenced {
		return
	}
	if m.kind == mFenced {
		u.fence(r)
		return
	}
	if !c.activated {
		u.activateReply(r, m)
		return
	}
	kind, ok := c.sent[m.id]
	if !ok {
		// checkReply: a reply to nothing outstanding is a protocol error.
		u.w.s.note("u%d: d%d answered %v, which it was not sent: fault", u.n, r, m)
		u.eng.Fault(r)
		u.apply()
		return
	}
	delete(c.sent, m.id)
	if cl, ok := u.calls[m.id]; ok {
		delete(u.calls, m.id)
		cl.done(m)
		return
	}
	u.jobReply(r, kind, m)
	u.apply()
}

func (u *upNode) activateReply(r int, m *message) {
	c := &u.conns[r]
	if m.kind != mActivateAck {
		// Refused (a higher generation holds the region, or the rejoin
		// is not allowed): the replica cannot take part now.
		u.w.s.note("u%d: d%d refused activation (%v)", u.n, r, m.code)
		if u.eng.Running() {
			u.eng.Fault(r)
			u.apply()
		}
		u.drop(r)
		return
	}
	c.activated = true
	if u.activating {
		for s := range u.conns {
			if !u.conns[s].activated {
				return
			}
		}
		u.activating = false
		if u.onActivated != nil {
			u.onActivated()
			return
		}
		u.eng.Activate([engine.ReplicaCount]bool{true, true, true}, 1)
		u.apply()
		return
	}
	if !u.eng.Running() {
		return
	}
	// replica.negotiate reads every session's extent versions before
	// the engine decides.
	u.rejoinWithVersions(r, c.epoch, m)
}

// rejoinWithVersions reads r's extent versions, then rejoins r.
func (u *upNode) rejoinWithVersions(r int, epoch uint64, ack *message) {
	n := int(u.w.spec.ExtentCount)
	left, failed := n, false
	versions := make([]wire.ExtentVersion, n)
	for e := range n {
		u.callOn(r, &message{kind: mExtentHashes, extent: uint32(e)}, func(m *message) {
			left--
			if m == nil || m.kind != mHashesReply {
				failed = true
			} else {
				versions[e] = wire.ExtentVersion{Gen: m.version.Gen, Flush: m.version.Flush, Dirty: m.version.Dirty}
			}
			if left > 0 || failed || u.conns[r].epoch != epoch || !u.eng.Running() {
				return
			}
			u.rejoin(r, ack, versions)
		})
	}
}

// rejoin brings r back into the activation after its session activated:
// a Faulted replica is Repairing first (replica.await), then the
// production sequence decides and acts (Engine.SessionActivated), and
// what is left to the driver is what replica.activated does with the
// decision: hold the session, or start the live repair.
func (u *upNode) rejoin(r int, m *message, versions []wire.ExtentVersion) {
	if u.eng.State(r) == engine.ReplicaFaulted {
		u.eng.RepairStarted(r)
	}
	wasOffline := u.eng.State(r) == engine.ReplicaOffline
	switch u.eng.SessionActivated(r, u.gen, versions, m.lost) {
	case engine.RejoinHold:
		u.hold(r)
	case engine.RejoinRepair:
		if wasOffline {
			u.w.s.note("u%d: d%d may have lost writes: repair, not replay", u.n, r)
		}
	}
	if u.eng.State(r) == engine.ReplicaRepairing && !u.held[r] {
		u.startRepair(r)
	}
	u.apply()
	if u.eng.State(r) == engine.ReplicaActive {
		u.releaseHeld()
	}
}

// jobReply applies a reply to an engine job.
func (u *upNode) jobReply(r int, kind msgKind, m *message) {
	switch kind {
	case mWrite, mFlush:
		switch {
		case m.kind == mAck:
			u.eng.Done(r, m.id)
		case m.kind == mError && m.code == wire.CodeHashMismatch:
			u.eng.Rejected(r, m.id)
		default:
			u.eng.Failed(r, m.id)
		}
	case mRead:
		u.readReply(r, m)
	}
}

// readReply verifies a read's data against the hashes the replica
// returned and lands it in the caller's buffer.
func (u *upNode) readReply(r int, m *message) {
	j := u.jobs[m.id]
	switch {
	case m.kind == mError && m.code == wire.CodeCorruptBlock:
		u.eng.ReadResult(r, m.id, engine.ReadBadData)
		return
	case m.kind != mReadResponse || j == nil:
		u.eng.ReadResult(r, m.id, engine.ReadFailed)
		return
	}
	if !u.eng.ReadBegin(r, m.id) {
		u.eng.ReadResult(r, m.id, engine.ReadFailed)
		return
	}
	copy(j.buf, m.data)
	bs := int(u.w.spec.BlockSize)
	out := engine.ReadGood
	for i, h := range m.hashes {
		if xxhash.Sum64(m.data[i*bs:(i+1)*bs]) != h {
			out = engine.ReadBadData
		}
	}
	u.eng.ReadResult(r, m.id, out)
}

// fence stops the upstairs: another took the region over.
func (u *upNode) fence(r int) {
	if u.fenced {
		return
	}
	u.w.s.note("u%d fenced (told by d%d)", u.n, r)
	u.fenced = true
	u.eng.Stop(upstairs.ErrFenced)
	u.apply()
	for s := range u.conns {
		u.drop(s)
	}
}

// apply carries out the engine's actions.
func (u *upNode) apply() {
	for {
		acts := u.eng.TakeActions()
		if len(acts) == 0 {
			return
		}
		for _, a := range acts {
			switch a.Kind {
			case engine.ActWake:
				u.wake(a.Replica)
			case engine.ActComplete:
				u.complete(a.ID, a.Err)
			case engine.ActPrivatize:
				j := u.jobs[a.ID]
				j.priv = append([]byte(nil), j.buf...)
				u.eng.Privatized(a.ID, true)
			case engine.ActRetire:
				delete(u.jobs, a.ID)
			case engine.ActRepairRead:
				if j := u.jobs[a.ID]; j != nil {
					j.repairTo = append(j.repairTo, a.Replica)
				}
			case engine.ActState:
				u.w.s.note("u%d: d%d is %v", u.n, a.Replica, a.State)
				if a.State == engine.ReplicaFaulted && u.conns[a.Replica].epoch != 0 {
					// The session of a faulted replica ends; its next
					// one starts the repair.
					r := a.Replica
					u.w.s.after(0, fmt.Sprintf("u%d drop faulted d%d", u.n, r), func() {
						if u.eng.State(r) == engine.ReplicaFaulted {
							u.drop(r)
						}
					})
				}
			case engine.ActRewrite:
				p := u.jobs[a.Parent]
				u.jobs[a.ID] = &ujob{kind: engine.KindWrite, first: p.first, count: p.count, buf: p.priv, hashes: p.hashes, priv: p.priv}
			}
		}
	}
}

// complete hands a finished job to its caller.
func (u *upNode) complete(id wire.JobID, err error) {
	j := u.jobs[id]
	if j == nil {
		return
	}
	if j.kind == engine.KindRead && err == nil {
		for _, r := range j.repairTo {
			// Write the good data back to the replica that had it bad.
			rid, ok := u.eng.SubmitRepair(r, id, j.first, j.count, len(j.buf))
			if ok {
				u.jobs[rid] = &ujob{kind: engine.KindWrite, first: j.first, count: j.count,
					buf: append([]byte(nil), j.buf...), hashes: u.w.hashBlocks(j.buf)}
				u.w.s.note("u%d read repair %d of d%d from read %d", u.n, rid, r, id)
			}
		}
	}
	if j.caller {
		u.w.completed(u, id, j, err)
	}
}

// wake schedules sending r's queued jobs and calls.
func (u *upNode) wake(r int) {
	u.w.s.after(u.w.s.between(0, 2), fmt.Sprintf("u%d send d%d", u.n, r), func() { u.sendPending(r) })
}

// sendPending sends r's engine jobs and repair calls merged in ID order,
// as replica.sendPending does.
func (u *upNode) sendPending(r int) {
	c := &u.conns[r]
	if c.epoch == 0 || !c.activated || u.fenced {
		return
	}
	l := u.w.link(u.n, r)
	for {
		next := u.eng.NextJobID(r)
		if len(c.queue) > 0 && (next == 0 || c.queue[0].id < next) {
			cl := c.queue[0]
			c.queue = c.queue[1:]
			c.sent[cl.id] = cl.msg.kind
			l.send(toDownstairs, cl.msg)
			continue
		}
		cj, ok := u.eng.TakeNext(r)
		if !ok {
			return
		}
		u.deps = u.eng.SendDeps(u.deps[:0], cj, r)
		j := u.jobs[cj.ID]
		m := &message{id: cj.ID, deps: append([]wire.JobID(nil), u.deps...), first: cj.First, count: cj.Count, from: u.n}
		switch cj.Kind {
		case engine.KindWrite:
			m.kind = mWrite
			data := j.buf
			if !cj.FromCaller(r) && j.priv != nil {
				data = j.priv
			}
			m.data = append([]byte(nil), data...)
			m.hashes = j.hashes
		case engine.KindRead:
			m.kind = mRead
		case engine.KindFlush:
			m.kind, m.flush, m.gen = mFlush, cj.FlushNumber, u.gen
		}
		c.sent[cj.ID] = m.kind
		l.send(toDownstairs, m)
		u.eng.Sent(r, cj.ID)
		u.apply()
		if c.epoch == 0 {
			return
		}
	}
}

// callOn queues a repair call to r on its current session; done gets the
// reply, or nil if the session ends first.
func (u *upNode) callOn(r int, m *message, done func(*message)) {
	c := &u.conns[r]
	if c.epoch == 0 || !c.activated {
		done(nil)
		return
	}
	m.id = u.eng.AllocID()
	m.from = u.n
	cl := &call{id: m.id, r: r, epoch: c.epoch, msg: m, done: done}
	u.calls[m.id] = cl
	c.queue = append(c.queue, cl)
	u.wake(r)
}

// repairWalk is one live-repair attempt of a replica.
type repairWalk struct {
	r     int
	src   int
	epoch uint64
	walk  *reconcile.LiveRepair
}

// startRepair starts the live repair of Repairing replica r.
func (u *upNode) startRepair(r int) {
	if u.repairs[r] != nil {
		return
	}
	rw := &repairWalk{r: r, epoch: u.conns[r].epoch, walk: reconcile.NewLiveRepair(u.w.spec.ExtentCount)}
	u.repairs[r] = rw
	u.eng.AttachLiveRepair(r, rw.walk)
	u.w.s.note("u%d live repair of d%d starts", u.n, r)
	u.repairNext(rw)
}

// repairNext repairs the next extent of rw's walk, or finishes it.
func (u *upNode) repairNext(rw *repairWalk) {
	r := rw.r
	if u.repairs[r] != rw {
		return
	}
	if u.eng.State(r) != engine.ReplicaRepairing || u.conns[r].epoch != rw.epoch {
		u.abortRepair(rw, "replica left repair")
		return
	}
	e, ok := rw.walk.Next()
	if !ok {
		u.finishRepair(rw)
		return
	}
	src := u.eng.LiveRepairSource(r, u.badSource[r]-1)
	rw.src = src
	if src < 0 {
		u.abortRepair(rw, "no active source")
		return
	}
	var srcH, dstH *message
	got := 0
	both := func() {
		got++
		if got < 2 {
			return
		}
		if srcH == nil || dstH == nil || srcH.kind != mHashesReply || dstH.kind != mHashesReply {
			u.abortRepair(rw, "extent hashes failed")
			return
		}
		u.repairCopy(rw, e, src, srcH, dstH)
	}
	u.callOn(src, &message{kind: mExtentHashes, extent: uint32(e)}, func(m *message) { srcH = m; both() })
	u.callOn(r, &message{kind: mExtentHashes, extent: uint32(e)}, func(m *message) { dstH = m; both() })
}

// repairCopy copies the differing blocks of extent e from src to rw's
// replica, then moves the walk on.
func (u *upNode) repairCopy(rw *repairWalk, e ids.ExtentID, src int, srcH, dstH *message) {
	next := func() {
		if err := rw.walk.Done(e); err != nil {
			u.abortRepair(rw, err.Error())
			return
		}
		u.wake(rw.r) // writes held for e may go now
		u.repairNext(rw)
	}
	srcV := reconcile.Version{Gen: srcH.version.Gen, Flush: srcH.version.Flush, Dirty: srcH.version.Dirty}
	dstV := reconcile.Version{Gen: dstH.version.Gen, Flush: dstH.version.Flush, Dirty: dstH.version.Dirty}
	if !reconcile.LiveRepairNeeded(srcV, dstV) {
		next()
		return
	}
	diff, err := reconcile.DiffBlocks(srcH.hashes, dstH.hashes)
	if err != nil {
		u.abortRepair(rw, err.Error())
		return
	}
	blocks := make([]uint32, len(diff))
	for i, b := range diff {
		blocks[i] = uint32(b)
	}
	final := srcH.version
	if len(blocks) == 0 {
		u.callOn(rw.r, &message{kind: mRepairWrite, extent: uint32(e), version: final}, func(m *message) {
			if m == nil || m.kind != mAck {
				u.abortRepair(rw, "repair write failed: "+replyText(m))
				return
			}
			next()
		})
		return
	}
	u.callOn(src, &message{kind: mRepairRead, extent: uint32(e), blocks: blocks}, func(m *message) {
		if m == nil || m.kind != mRepairData {
			if m != nil && m.code == wire.CodeCorruptBlock {
				u.badSource[rw.r] = 1 + src
			}
			u.abortRepair(rw, "repair read failed: "+replyText(m))
			return
		}
		w := &message{kind: mRepairWrite, extent: uint32(e), blocks: blocks, data: m.data, hashes: m.hashes, version: final}
		u.callOn(rw.r, w, func(m *message) {
			if m == nil || m.kind != mAck {
				if m != nil && m.code == wire.CodeHashMismatch {
					u.badSource[rw.r] = 1 + src
				}
				u.abortRepair(rw, "repair write failed: "+replyText(m))
				return
			}
			next()
		})
	})
}

func (u *upNode) abortRepair(rw *repairWalk, why string) {
	r := rw.r
	if u.repairs[r] != rw {
		return
	}
	u.repairs[r] = nil
	u.w.s.note("u%d live repair of d%d aborted: %s", u.n, r, why)
	rw.walk.Abort()
	u.eng.DetachLiveRepair(r, rw.walk)
	u.eng.Fault(r)
	u.apply()
	u.drop(r)
}

func (u *upNode) finishRepair(rw *repairWalk) {
	r := rw.r
	u.repairs[r] = nil
	u.badSource[r] = 0
	u.eng.DetachLiveRepair(r, rw.walk)
	if !u.eng.RepairDone(r) {
		u.eng.Fault(r)
		u.apply()
		return
	}
	u.w.s.note("u%d live repair of d%d done", u.n, r)
	u.apply()
	u.releaseHeld()
	u.flushAfterRepair()
}

// flushAfterRepair submits the flush that follows a repair without
// waiting for room (Upstairs.backgroundFlush): jobs held for the repaired
// replica wait for it.
func (u *upNode) flushAfterRepair() {
	if !u.running() {
		return
	}
	if id, err := u.eng.SubmitFlush(); err == nil {
		u.jobs[id] = &ujob{kind: engine.KindFlush, background: true}
		u.apply()
	}
}

// submit adds a workload job; false when the engine refuses it now.
func (u *upNode) submit(kind engine.JobKind, first ids.BlockIndex, count uint32, data []byte) (wire.JobID, bool) {
	if !u.running() {
		return 0, false
	}
	bytes := int(count) * int(u.w.spec.BlockSize)
	if kind == engine.KindFlush {
		bytes = 0
	}
	if u.eng.Full(bytes) {
		return 0, false
	}
	var id wire.JobID
	var err error
	j := &ujob{kind: kind, first: first, count: count, caller: true}
	switch kind {
	case engine.KindWrite:
		id, err = u.eng.SubmitWrite(first, count, bytes)
		j.buf, j.hashes = data, u.w.hashBlocks(data)
	case engine.KindRead:
		id, err = u.eng.SubmitRead(first, count, bytes)
		j.buf = make([]byte, bytes)
	case engine.KindFlush:
		id, err = u.eng.SubmitFlush()
	}
	if err != nil {
		return 0, false
	}
	u.jobs[id] = j
	return id, true
}

// replyText describes a reply for the trace.
func replyText(m *message) string {
	switch {
	case m == nil:
		return "session ended"
	case m.kind == mError:
		return fmt.Sprintf("error %v", m.code)
	}
	return m.kind.String()
}
