package upstairs

import (
	"fmt"
	"slices"
	"time"

	"tern/volume/extent"
	"tern/volume/upstairs/engine"
	"tern/volume/wire"
)

// This file holds what a session checks of its downstairs' replies:
// that each answers, once, something the session sent, with the right
// type and size (ErrProtocol otherwise), that none is owed for longer
// than Config.ReplyTimeout, and that the region it serves is sane.

// checkGeometry refuses a region no downstairs can serve (the limits of
// extent.Spec), before anything is sized by it: the extent versions, the
// live-repair walk and the repair buffers all scale with it.
func checkGeometry(g wire.RegionInfo) error {
	s := extent.Spec{UUID: g.UUID, BlockSize: g.BlockSize, ExtentBlocks: g.ExtentBlocks,
		ExtentCount: g.ExtentCount, FormatVersion: extent.FormatVersion1}
	return s.Validate()
}

// invalidRegion handles a downstairs serving an invalid region: it takes
// no part in the activation (which goes ahead without it after
// Config.ActivationQuorumWait) and, once IO runs, it is faulted.
func (r *replica) invalidRegion(err error) error {
	u := r.u
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.eng.Running() {
		r.dropLocked(err, func() { u.eng.Fault(r.id) })
	}
	return err
}

// resetSentLocked starts a session with nothing owed.
func (r *replica) resetSentLocked() {
	if r.sent == nil {
		r.sent = make(map[wire.JobID]sentJob)
	}
	clear(r.sent)
	r.sendOrder = r.sendOrder[:0]
}

// noteSentLocked records that job or call id went out now.
func (r *replica) noteSentLocked(id wire.JobID) {
	if len(r.sendOrder) > 2*(len(r.sent)+len(r.inflight))+64 {
		// Mostly answered: drop those, keeping send order.
		r.sendOrder = slices.DeleteFunc(r.sendOrder, func(s sentAt) bool { return !r.owesLocked(s.id) })
	}
	r.sendOrder = append(r.sendOrder, sentAt{id: id, at: time.Now()})
}

func (r *replica) owesLocked(id wire.JobID) bool {
	_, job := r.sent[id]
	_, call := r.inflight[id]
	return job || call
}

// checkReplyTimeout runs when the serve loop's reply timer fires: it
// fails the session if the oldest job or call it sent has waited longer
// than Config.ReplyTimeout, else re-arms t for that job's deadline (or a
// whole timeout when nothing is owed). A stalled downstairs is so dropped
// within twice the timeout: its reads move to a peer, its writes wait in
// the Offline backlog (which faults it if it overflows).
func (r *replica) checkReplyTimeout(t *time.Timer) error {
	u := r.u
	timeout := u.cfg.ReplyTimeout
	u.mu.Lock()
	defer u.mu.Unlock()
	answered := 0
	for answered < len(r.sendOrder) && !r.owesLocked(r.sendOrder[answered].id) {
		answered++
	}
	r.sendOrder = slices.Delete(r.sendOrder, 0, answered)
	if len(r.sendOrder) == 0 {
		t.Reset(timeout)
		return nil
	}
	oldest := r.sendOrder[0]
	waited := time.Since(oldest.at)
	if waited >= timeout {
		return fmt.Errorf("replica %d left job %d unanswered for %v (reply timeout %v)",
			r.id, oldest.id, waited.Round(time.Millisecond), timeout)
	}
	t.Reset(timeout - waited)
	return nil
}

// requestTypes names what a job kind sends.
var requestTypes = [...]wire.MsgType{engine.KindWrite: wire.TypeWrite, engine.KindRead: wire.TypeRead, engine.KindFlush: wire.TypeFlush}

// replyKind is what a decoded reply is to the session that received it.
type replyKind int

const (
	// replyJob answers one of the engine's jobs sent on the session.
	replyJob replyKind = iota + 1
	// replyCall answers an in-flight call.
	replyCall
	// replyFenced is a Fenced answering no call: the session ends with
	// ErrFenced.
	replyFenced
	// replySessionError is an Error answering no call that names no job
	// or says CodeFenced: the session ends.
	replySessionError
)

// checkReply decides what reply m is to the session of replica rep,
// which is owed replies to the jobs in sent and the calls in inflight
// (blockSize is the region's), and takes what m answers out of sent or
// inflight. A reply that answers nothing owed, or answers with the wrong
// type or size, is an error wrapping ErrProtocol and leaves both as they
// were. It is pure: replica.readLoop calls it under Upstairs.mu and
// applies the outcome, and FuzzReplicaReplies drives it with a decoder.
func checkReply(rep int, m wire.Message, sent map[wire.JobID]sentJob, inflight map[wire.JobID]*call,
	blockSize int) (replyKind, *call, error) {
	id, ok := wire.JobOf(m)
	if c := inflight[id]; ok && id != 0 && c != nil {
		if err := answersCall(c.req, m, blockSize); err != nil {
			return 0, nil, fmt.Errorf("replica %d %w (call %d): %w", rep, err, id, ErrProtocol)
		}
		delete(inflight, id)
		return replyCall, c, nil
	}
	switch m := m.(type) {
	case *wire.Fenced:
		return replyFenced, nil, nil
	case *wire.Error:
		if m.JobID == 0 || m.Code == wire.CodeFenced {
			return replySessionError, nil, nil
		}
	}
	if !ok || id == 0 {
		return 0, nil, fmt.Errorf("replica %d sent unsolicited %v: %w", rep, m.Type(), ErrProtocol)
	}
	s, ok := sent[id]
	if !ok {
		return 0, nil, fmt.Errorf("replica %d sent %v for job %d, which it was not sent or already answered: %w",
			rep, m.Type(), id, ErrProtocol)
	}
	req := requestTypes[s.kind]
	switch m := m.(type) {
	case *wire.Error:
	case *wire.Ack:
		if s.kind == engine.KindRead {
			return 0, nil, fmt.Errorf("replica %d answered %v with Ack (job %d): %w", rep, req, id, ErrProtocol)
		}
	case *wire.ReadResponse:
		switch {
		case s.kind != engine.KindRead:
			return 0, nil, fmt.Errorf("replica %d answered %v with ReadResponse (job %d): %w", rep, req, id, ErrProtocol)
		case len(m.Data) != s.bytes:
			return 0, nil, fmt.Errorf("replica %d sent %d bytes for a read of %d (job %d): %w",
				rep, len(m.Data), s.bytes, id, ErrProtocol)
		case len(m.Hashes)*blockSize != len(m.Data):
			return 0, nil, fmt.Errorf("replica %d sent %d hashes for %d blocks (job %d): %w",
				rep, len(m.Hashes), len(m.Data)/max(blockSize, 1), id, ErrProtocol)
		}
	default:
		return 0, nil, fmt.Errorf("replica %d answered %v with %v (job %d): %w", rep, req, m.Type(), id, ErrProtocol)
	}
	delete(sent, id)
	return replyJob, nil, nil
}

// answersCall checks that m is a reply call request req may get: an
// Error, a Fenced, or its own reply type; a RepairData must carry the
// blocks asked for, with their data.
func answersCall(req, m wire.Message, blockSize int) error {
	var want wire.MsgType
	switch req.(type) {
	case *wire.ExtentHashesRequest:
		want = wire.TypeExtentHashes
	case *wire.ExtentVersionsRequest:
		want = wire.TypeExtentVersions
	case *wire.RegionInfoRequest:
		want = wire.TypeRegionInfoReply
	case *wire.RepairRead:
		want = wire.TypeRepairData
	case *wire.RepairWrite, *wire.Flush:
		want = wire.TypeAck
	}
	switch t := m.Type(); {
	case t == wire.TypeError || t == wire.TypeFenced:
		return nil
	case t != want:
		return fmt.Errorf("answered %v with %v", req.Type(), t)
	}
	if d, ok := m.(*wire.RepairData); ok {
		r := req.(*wire.RepairRead)
		if d.Extent != r.Extent || !slices.Equal(d.Blocks, r.Blocks) || len(d.Data) != len(d.Blocks)*blockSize {
			return fmt.Errorf("answered a RepairRead of %d blocks of extent %d with %d blocks, %d bytes of extent %d",
				len(r.Blocks), r.Extent, len(d.Blocks), len(d.Data), d.Extent)
		}
	}
	return nil
}

// violated faults the replica after reply m broke the protocol (err). A
// read whose data the decoder put in the caller's buffer is settled as
// failed first, so it moves to a peer, which overwrites that buffer.
func (r *replica) violated(m wire.Message, err error) {
	u := r.u
	u.log.Error("downstairs broke the protocol; faulting it", "replica", r.id, "target", r.target, "err", err)
	u.mu.Lock()
	if id, _ := wire.JobOf(m); r.landed == id && r.landedBuf != nil {
		u.eng.ReadResult(r.id, id, engine.ReadFailed)
	}
	r.landed, r.landedBuf = 0, nil
	r.dropLocked(err, func() { u.eng.Fault(r.id) })
	u.finishLocked()
}
