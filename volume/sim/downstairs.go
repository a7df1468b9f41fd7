package sim

import (
	"errors"
	"fmt"

	"github.com/google/uuid"

	"tern/volume/downstairs"
	"tern/volume/extent"
	"tern/volume/ids"
	"tern/volume/wire"
)

// dsNode is one simulated downstairs: the real extent store (an
// extent.Region on a simulated disk) and, per session, the real job
// ordering engine (downstairs.JobOrder). It plays the part of the
// downstairs server's session owner and workers: admits requests as
// session.handle does (fencing with downstairs.MayActivate, the active
// check, the flush generation check), runs the jobs the engine releases
// after a simulated service time, and replies on the session's link.
type dsNode struct {
	w           *world
	id          int
	disk        *disk
	region      *extent.Region // nil while crashed
	incarnation uint64         // grows at every crash: stale events see it
	sessions    [upstairsMax]*dsSession
	active      *dsSession
}

// dsSession is one upstairs connection to the node.
type dsSession struct {
	up       int
	epoch    uint64
	upstairs uuid.UUID
	gen      ids.Generation
	fenced   bool
	order    *downstairs.JobOrder
	jobs     map[wire.JobID]*message
}

func (d *dsNode) alive() bool { return d.region != nil }

// session returns the session of upstairs up on connection epoch,
// starting it if epoch is new (the upstairs dialled).
func (d *dsNode) session(up int, epoch uint64) *dsSession {
	s := d.sessions[up]
	if s != nil && s.epoch == epoch {
		return s
	}
	if s != nil {
		d.endSession(s)
	}
	s = &dsSession{up: up, epoch: epoch, upstairs: d.w.up[up].uuid, order: downstairs.NewJobOrder(), jobs: map[wire.JobID]*message{}}
	d.sessions[up] = s
	return s
}

// endSession forgets a session whose connection is gone: jobs not yet
// started are dropped, running ones finish unanswered.
func (d *dsNode) endSession(s *dsSession) {
	s.order.Drop()
	if d.active == s {
		d.active = nil
	}
	if d.sessions[s.up] == s {
		d.sessions[s.up] = nil
	}
}

func (d *dsNode) reply(s *dsSession, m *message) {
	if d.sessions[s.up] != s {
		return
	}
	d.w.link(s.up, d.id).send(toUpstairs, m)
}

// requestOf names each request the simulated upstairs sends for the
// downstairs' own admission and ordering rules.
var requestOf = map[msgKind]downstairs.Request{
	mRead:         downstairs.RequestRead,
	mWrite:        downstairs.RequestWrite,
	mFlush:        downstairs.RequestFlush,
	mExtentHashes: downstairs.RequestExtentHashes,
	mRepairRead:   downstairs.RequestRepairRead,
	mRepairWrite:  downstairs.RequestRepairWrite,
}

// receive admits one request of upstairs up's connection epoch.
func (d *dsNode) receive(up int, epoch uint64, m *message) {
	if !d.alive() {
		return
	}
	s := d.session(up, epoch)
	if m.kind == mActivate {
		d.activate(s, m)
		return
	}
	if s.fenced {
		d.reply(s, &message{kind: mFenced, id: m.id})
		return
	}
	req, known := requestOf[m.kind]
	if !known {
		d.reply(s, &message{kind: mError, id: m.id, code: wire.CodeBadRequest})
		return
	}
	if code, ok := downstairs.Admit(req, false, d.active == s, m.gen, s.gen); !ok {
		d.reply(s, &message{kind: mError, id: m.id, code: code})
		return
	}
	mode, first, end := downstairs.AccessOf(req, uint64(m.first), uint64(m.count), ids.ExtentID(m.extent), d.w.spec.ExtentBlocks)
	run, ok := s.order.Submit(m.id, m.deps, mode, first, end)
	if !ok {
		d.reply(s, &message{kind: mError, id: m.id, code: wire.CodeBadRequest})
		return
	}
	s.jobs[m.id] = m
	if run {
		d.dispatch(s, m)
	}
}

// activate applies the fencing rule to an Activate, as Server.activate.
func (d *dsNode) activate(s *dsSession, m *message) {
	if s.fenced {
		d.reply(s, &message{kind: mFenced, id: m.id})
		return
	}
	g, holder := d.region.GenHolder()
	if !downstairs.MayActivate(m.gen, s.upstairs, ids.Generation(g), holder) {
		d.reply(s, &message{kind: mError, id: m.id, code: wire.CodeGenTooLow})
		return
	}
	if err := d.region.SetGenHolder(ids.Generation(m.gen), s.upstairs); err != nil {
		d.reply(s, &message{kind: mError, id: m.id, code: wire.CodeIO})
		return
	}
	old := d.active
	d.active, s.gen = s, m.gen
	if old != nil && old != s {
		old.fenced = true
		d.w.s.note("d%d fences u%d (gen %d) for u%d (gen %d)", d.id, old.up, old.gen, s.up, s.gen)
		d.reply(old, &message{kind: mFenced})
	}
	d.reply(s, &message{kind: mActivateAck, id: m.id, gen: m.gen, lost: d.region.MayHaveLostWrites()})
}

// dispatch starts a runnable job: it completes after a service time.
func (d *dsNode) dispatch(s *dsSession, m *message) {
	inc := d.incarnation
	d.w.s.after(d.w.s.between(1, 6), fmt.Sprintf("d%d run %v u%d", d.id, m, s.up), func() {
		if d.incarnation != inc {
			return // crashed meanwhile: the job never finished
		}
		r := d.execute(s, m)
		for _, id := range s.order.Complete(m.id) {
			d.dispatch(s, s.jobs[id])
		}
		delete(s.jobs, m.id)
		d.reply(s, r)
	})
}

// execute runs one job against the region and returns its reply. A
// mutation checks, at the moment it applies, that its session is still
// the active one (the fence's read lock in job.execute).
func (d *dsNode) execute(s *dsSession, m *message) *message {
	r := d.region
	mutates := m.kind == mWrite || m.kind == mFlush || m.kind == mRepairWrite
	if mutates && (d.active != s || s.fenced) {
		return &message{kind: mFenced, id: m.id}
	}
	if mutates {
		d.w.checkNotFenced(d, s)
	}
	switch m.kind {
	case mWrite:
		if err := r.WriteBlocks(ids.BlockIndex(m.first), m.data, m.hashes); err != nil {
			return errReply(m.id, err)
		}
		d.w.applied(d.id, s.up, m)
		return &message{kind: mAck, id: m.id}
	case mFlush:
		if err := r.Flush(m.flush, ids.Generation(m.gen)); err != nil {
			return errReply(m.id, err)
		}
		return &message{kind: mAck, id: m.id}
	case mRead:
		p := make([]byte, int(m.count)*int(d.w.spec.BlockSize))
		hs := make([]uint64, m.count)
		if err := r.ReadBlocks(ids.BlockIndex(m.first), p, hs); err != nil {
			return errReply(m.id, err)
		}
		return &message{kind: mReadResponse, id: m.id, data: p, hashes: hs}
	case mExtentHashes:
		hs, err := r.ExtentHashes(ids.ExtentID(m.extent), nil)
		if err != nil {
			return errReply(m.id, err)
		}
		v, _ := r.ExtentVersion(ids.ExtentID(m.extent))
		return &message{kind: mHashesReply, id: m.id, extent: m.extent, hashes: hs, version: v}
	case mRepairRead:
		p := make([]byte, len(m.blocks)*int(d.w.spec.BlockSize))
		hs := make([]uint64, len(m.blocks))
		if err := r.ReadExtentBlocks(ids.ExtentID(m.extent), m.blocks, p, hs); err != nil {
			return errReply(m.id, err)
		}
		return &message{kind: mRepairData, id: m.id, extent: m.extent, blocks: m.blocks, data: p, hashes: hs}
	case mRepairWrite:
		if err := r.RepairExtent(ids.ExtentID(m.extent), m.blocks, m.data, m.hashes, m.version); err != nil {
			return errReply(m.id, err)
		}
		for _, b := range m.blocks {
			delete(d.w.flipped[d.id], uint64(m.extent)*uint64(d.w.spec.ExtentBlocks)+uint64(b))
		}
		return &message{kind: mAck, id: m.id}
	}
	return &message{kind: mError, id: m.id, code: wire.CodeBadRequest}
}

func errReply(id wire.JobID, err error) *message {
	code := wire.CodeIO
	switch {
	case errors.Is(err, extent.ErrHashMismatch):
		code = wire.CodeHashMismatch
	case errors.Is(err, extent.ErrCorruptBlock):
		code = wire.CodeCorruptBlock
	case errors.Is(err, extent.ErrOutOfRange):
		code = wire.CodeOutOfRange
	}
	return &message{kind: mError, id: id, code: code}
}

// crash stops the node at once: what the disk had not synced may be lost
// (with power) or torn (with tear), jobs in flight never finish,
// connections drop. Without power only the process dies: the disk keeps
// every write.
func (d *dsNode) crash(power, tear bool) {
	if !d.alive() {
		return
	}
	_ = d.region.Close() // Close does not flush
	d.region = nil
	d.incarnation++
	for _, s := range d.sessions {
		if s != nil {
			d.endSession(s)
		}
	}
	pick := d.w.s.intn
	if !power {
		pick = func(n int) int { return n - 1 } // every pending write reached the disk
	}
	lost, torn := d.disk.crash(pick, tear)
	d.w.s.note("d%d crash: %d files lost writes, %d torn", d.id, lost, torn)
}

// restart opens the region again (verifying dirty extents).
func (d *dsNode) restart() error {
	if d.alive() {
		return nil
	}
	r, err := extent.OpenOn(d.disk, fmt.Sprintf("d%d", d.id))
	if err != nil {
		return fmt.Errorf("restart downstairs %d: %w", d.id, err)
	}
	d.region = r
	d.w.s.note("d%d restarted: corrupt blocks %v", d.id, r.CorruptBlocks())
	return nil
}

// replace gives the node a new, empty region on a new disk (a replaced
// replica), keeping the region's identity.
func (d *dsNode) replace() error {
	if d.alive() {
		_ = d.region.Close()
		d.region = nil
	}
	d.incarnation++
	for _, s := range d.sessions {
		if s != nil {
			d.endSession(s)
		}
	}
	d.disk = newDisk()
	r, err := extent.CreateOn(d.disk, fmt.Sprintf("d%d", d.id), d.w.spec)
	if err != nil {
		return fmt.Errorf("replace downstairs %d: %w", d.id, err)
	}
	d.region = r
	return nil
}
