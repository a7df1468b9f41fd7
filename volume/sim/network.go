package sim

import (
	"fmt"

	"tern/volume/extent"
	"tern/volume/ids"
	"tern/volume/wire"
)

// msgKind is what a simulated message carries. Messages mirror the wire
// protocol's (package tern/volume/wire) without its encoding: the codec is
// fuzzed on its own, the simulation is about order, loss and timing.
type msgKind uint8

const (
	mActivate msgKind = iota + 1
	mActivateAck
	mWrite
	mRead
	mFlush
	mExtentHashes
	mRepairRead
	mRepairWrite
	mAck
	mReadResponse
	mHashesReply
	mRepairData
	mError
	mFenced
)

var msgNames = [...]string{
	mActivate: "activate", mActivateAck: "activate-ack", mWrite: "write", mRead: "read",
	mFlush: "flush", mExtentHashes: "extent-hashes", mRepairRead: "repair-read",
	mRepairWrite: "repair-write", mAck: "ack", mReadResponse: "read-response",
	mHashesReply: "hashes", mRepairData: "repair-data", mError: "error", mFenced: "fenced",
}

func (k msgKind) String() string { return msgNames[k] }

// message is one request or reply of a session.
type message struct {
	kind    msgKind
	id      wire.JobID
	deps    []wire.JobID
	gen     ids.Generation
	first   ids.BlockIndex
	count   uint32
	flush   uint64
	data    []byte
	hashes  []uint64
	extent  uint32
	blocks  []uint32
	version extent.Version
	code    wire.ErrorCode
	from    int  // upstairs number (0 or 1) of a request
	lost    bool // ActivateAck.LostWrites
}

func (m *message) String() string {
	return fmt.Sprintf("%v#%d", m.kind, m.id)
}

// direction of a stream on a link.
const (
	toDownstairs = 0
	toUpstairs   = 1
)

// link is the connection between one upstairs and one downstairs: an
// ordered, reliable stream each way as QUIC gives tern, carried over a
// simulated lossy network. Each message travels as a numbered packet the
// network may delay, reorder, drop or duplicate; the receiving end keeps
// them in order, discards duplicates, and a dropped packet is sent again
// after a retransmission timeout. A connection is an epoch: a disconnect
// ends it, and packets of an old epoch are discarded on arrival.
type link struct {
	w     *world
	up    int // upstairs number
	ds    int // downstairs number
	epoch uint64
	open  bool
	dirs  [2]stream
}

type stream struct {
	nextSend uint64
	nextRecv uint64
	held     map[uint64]*message
}

// connect starts a new connection epoch.
func (l *link) connect() uint64 {
	l.w.epochs++
	l.epoch = l.w.epochs
	l.open = true
	for d := range l.dirs {
		l.dirs[d] = stream{held: make(map[uint64]*message)}
	}
	return l.epoch
}

// sever ends the current connection.
func (l *link) sever() {
	l.open = false
	l.epoch = 0
}

// send transmits m in direction dir on the current epoch; deliver runs at
// the receiving end, in order.
func (l *link) send(dir int, m *message) {
	if !l.open {
		return
	}
	st := &l.dirs[dir]
	seq := st.nextSend
	st.nextSend++
	l.transmit(dir, l.epoch, seq, m, 0)
}

// transmit puts one packet on the network, applying message faults.
func (l *link) transmit(dir int, epoch, seq uint64, m *message, attempt int) {
	w := l.w
	name := fmt.Sprintf("u%d-d%d/%d pkt %d.%d %v", l.up, l.ds, dir, epoch, seq, m)
	delay := w.s.between(1, 4)
	if w.fault(faultDrop) && attempt < 8 {
		w.s.note("fault drop %s", name)
		// The sender's transport notices the loss and sends it again.
		w.s.after(w.cfg.RetransmitTicks, "retransmit "+name, func() { l.transmit(dir, epoch, seq, m, attempt+1) })
		return
	}
	if w.fault(faultDelay) {
		delay += w.s.between(20, 200)
		w.s.note("fault delay %s", name)
	}
	if w.fault(faultReorder) {
		delay += w.s.between(1, 12)
		w.s.note("fault reorder %s", name)
	}
	if w.fault(faultDuplicate) {
		w.s.note("fault duplicate %s", name)
		w.s.after(w.s.between(1, 30), "dup "+name, func() { l.arrive(dir, epoch, seq, m) })
	}
	w.s.after(delay, name, func() { l.arrive(dir, epoch, seq, m) })
}

// arrive receives a packet: in order, once, on its epoch only.
func (l *link) arrive(dir int, epoch, seq uint64, m *message) {
	if !l.open || epoch != l.epoch {
		return // the connection it belonged to is gone
	}
	st := &l.dirs[dir]
	if seq < st.nextRecv {
		return // duplicate
	}
	if _, dup := st.held[seq]; dup {
		return
	}
	st.held[seq] = m
	for {
		next, ok := st.held[st.nextRecv]
		if !ok {
			return
		}
		delete(st.held, st.nextRecv)
		st.nextRecv++
		if dir == toDownstairs {
			l.w.ds[l.ds].receive(l.up, epoch, next)
		} else {
			l.w.up[l.up].receive(l.ds, epoch, next)
		}
		if !l.open || l.epoch != epoch {
			return // the delivery ended the connection
		}
	}
}
