package upstairs

import (
	"errors"
	"fmt"
	"time"

	"tern/volume/dsclient"
	"tern/volume/upstairs/engine"
	"tern/volume/wire"
)

// serve runs the IO phase of a session: this goroutine sends, a helper
// decodes replies. It returns when the connection fails, the replica stops
// taking IO or the upstairs closes, after the helper has ended and the
// engine has been told.
func (r *replica) serve(c *dsclient.Conn) error {
	u := r.u
	r.blockSize = u.blockSize // fixed once activated
	u.mu.Lock()
	r.resetSentLocked()
	u.mu.Unlock()
	readerDone := make(chan error, 1)
	go func() { readerDone <- r.readLoop(c) }()
	replyTimer := time.NewTimer(u.cfg.ReplyTimeout)
	defer replyTimer.Stop()
	var err error
	readerEnded := false
loop:
	for {
		if err = r.sendPending(c); err != nil {
			break
		}
		select {
		case <-r.wake:
		case <-replyTimer.C:
			if err = r.checkReplyTimeout(replyTimer); err != nil {
				break loop
			}
		case err = <-readerDone:
			readerEnded = true
			break loop
		case <-u.ctx.Done():
			err = u.ctx.Err()
			break loop
		}
	}
	c.Close("session closed")
	if !readerEnded {
		// A protocol violation faults the replica, which also stops the
		// sender; the violation is what the session ended with.
		if rerr := <-readerDone; errors.Is(rerr, ErrProtocol) {
			err = rerr
		}
	}
	r.endCalls(err)
	u.mu.Lock()
	if a := u.act; a != nil && !u.eng.Running() && u.eng.StopErr() == nil && a.done[r.id] {
		// Lost before guest IO started: this replica misses the
		// activation (it will need repair) unless Activate has not
		// decided yet and it comes back in time.
		a.done[r.id] = false
		a.notifyLocked()
	}
	u.unholdLocked(r.id)
	r.dropLocked(err, func() { u.eng.Disconnected(r.id) })
	u.finishLocked()
	return err
}

// sendPending sends the engine's queued jobs and the repair calls of this
// replica, merged in ID order: a call is sent only after every job queued
// before it was issued, so a repair read on a source follows the guest
// writes submitted before it. Jobs the engine holds (a replica under live
// repair) do not hold calls back.
func (r *replica) sendPending(c *dsclient.Conn) error {
	u := r.u
	for {
		u.mu.Lock()
		switch st := u.eng.State(r.id); {
		case st == engine.ReplicaActive, st == engine.ReplicaConnecting, st == engine.ReplicaRepairing:
		case r.held && st != engine.ReplicaStopped:
			// Held for a restart reconciliation: calls only (an Offline
			// or Faulted replica is sent no job).
		default:
			u.mu.Unlock()
			return fmt.Errorf("replica %d is %v: %w", r.id, st, errSessionEnded)
		}
		next := u.eng.NextJobID(r.id)
		if len(r.calls) > 0 && (next == 0 || r.calls[0].id < next) {
			u.mu.Unlock()
			if err := r.sendCall(c); err != nil {
				return err
			}
			continue
		}
		j, ok := u.eng.TakeNext(r.id)
		if !ok {
			u.mu.Unlock()
			r.picked(0)
			return nil
		}
		msg := r.messageLocked(j)
		id := j.ID
		r.sent[id] = sentJob{kind: j.Kind, bytes: j.Bytes}
		r.noteSentLocked(id)
		u.mu.Unlock()
		r.picked(id)
		err := c.Send(msg)
		u.mu.Lock()
		u.eng.Sent(r.id, id)
		u.stepLocked()
		u.finishLocked()
		if err != nil {
			return fmt.Errorf("sending to replica %d: %w", r.id, err)
		}
	}
}

// picked runs the test hook that sees which job the sender took (0: none).
func (r *replica) picked(id wire.JobID) {
	if h := r.u.ioHooks; h != nil && h.sendPicked != nil {
		h.sendPicked(r.id, id)
	}
}

// messageLocked builds j's request in one of the replica's reused messages.
func (r *replica) messageLocked(j *engine.Job) wire.Message {
	u := r.u
	r.deps = u.eng.SendDeps(r.deps[:0], j, r.id)
	switch j.Kind {
	case engine.KindWrite:
		rec := u.recs[j.ID]
		if rec == nil {
			panic(fmt.Sprintf("upstairs: write job %d has no record", j.ID))
		}
		r.writeMsg = wire.Write{JobID: j.ID, Deps: r.deps, Offset: j.First, Hashes: rec.hashes, Data: rec.data}
		return &r.writeMsg
	case engine.KindRead:
		r.readMsg = wire.Read{JobID: j.ID, Deps: r.deps, Offset: j.First, Count: j.Count}
		return &r.readMsg
	default:
		r.flushMsg = wire.Flush{JobID: j.ID, Deps: r.deps, FlushNumber: j.FlushNumber, Gen: u.gen}
		return &r.flushMsg
	}
}

// dataBuffer tells the decoder to put a read's data straight into the
// caller's buffer when the engine allows it.
func (r *replica) dataBuffer(t wire.MsgType, id wire.JobID, n int) []byte {
	r.landed, r.landedBuf = 0, nil
	u := r.u
	u.mu.Lock()
	defer u.mu.Unlock()
	if t == wire.TypeRepairData {
		return r.callData(id, n)
	}
	if t != wire.TypeReadResponse {
		return nil
	}
	rec := u.recs[id]
	if rec == nil || len(rec.data) != n || !u.eng.ReadBegin(r.id, id) {
		return nil
	}
	r.landed, r.landedBuf = id, rec.data
	return rec.data
}

// readLoop decodes replies until the connection fails or the downstairs
// breaks the protocol. Every reply must answer, once, a job or call sent
// on this session, with the type and size it asked for (checkReply);
// anything else faults the replica (ErrProtocol), as a downstairs that
// answers what it was not asked cannot be trusted to hold what its peers
// hold.
func (r *replica) readLoop(c *dsclient.Conn) error {
	u := r.u
	c.SetDataBuffer(r.dataBuffer)
	for {
		m, err := c.Receive()
		if err != nil {
			return fmt.Errorf("reading from replica %d: %w", r.id, err)
		}
		u.mu.Lock()
		kind, c, err := checkReply(r.id, m, r.sent, r.inflight, r.blockSize)
		u.mu.Unlock()
		if err != nil {
			r.violated(m, err)
			return err
		}
		switch kind {
		case replyCall:
			r.answer(c, m)
			if f, ok := m.(*wire.Fenced); ok {
				u.fence(r.id, f.ByGen)
				return fmt.Errorf("replica %d: %w", r.id, ErrFenced)
			}
		case replyFenced:
			u.fence(r.id, m.(*wire.Fenced).ByGen)
			return fmt.Errorf("replica %d: %w", r.id, ErrFenced)
		case replySessionError:
			return r.sessionError(m.(*wire.Error))
		case replyJob:
			r.jobReply(m)
		}
	}
}

// jobReply applies a reply checkReply accepted as answering a job.
func (r *replica) jobReply(m wire.Message) {
	u := r.u
	switch m := m.(type) {
	case *wire.Ack:
		u.mu.Lock()
		u.eng.Done(r.id, m.JobID)
		u.stepLocked()
		u.finishLocked()
	case *wire.ReadResponse:
		out := engine.ReadFailed
		if r.landed == m.JobID && r.landedBuf != nil {
			out = verifyBlocks(r.landedBuf, m.Hashes, r.blockSize)
			if out == engine.ReadBadData {
				u.log.Warn("read data failed verification", "replica", r.id, "job", m.JobID)
			}
		}
		r.landed, r.landedBuf = 0, nil
		u.mu.Lock()
		u.eng.ReadResult(r.id, m.JobID, out)
		u.stepLocked()
		u.finishLocked()
	case *wire.Error:
		r.jobError(m)
	}
}

// verifyBlocks checks every block against the hash the downstairs
// returned.
func verifyBlocks(data []byte, hashes []uint64, blockSize int) engine.ReadOutcome {
	if blockSize <= 0 || len(hashes)*blockSize != len(data) {
		return engine.ReadFailed
	}
	for i, h := range hashes {
		if !blockMatches(data[i*blockSize:(i+1)*blockSize], h) {
			return engine.ReadBadData
		}
	}
	return engine.ReadGood
}

// sessionError handles a session-level Error (JobID zero, or fencing),
// which ends the session.
func (r *replica) sessionError(m *wire.Error) error {
	if m.Code == wire.CodeFenced {
		r.u.fence(r.id, 0)
		return fmt.Errorf("replica %d: %w", r.id, ErrFenced)
	}
	return fmt.Errorf("replica %d session failed: %w", r.id, m.Err())
}

// jobError handles an Error answering one job.
func (r *replica) jobError(m *wire.Error) {
	u := r.u
	u.mu.Lock()
	j, ok := u.eng.Lookup(m.JobID)
	switch {
	case !ok:
	case j.Kind == engine.KindRead && m.Code == wire.CodeCorruptBlock:
		u.eng.ReadResult(r.id, m.JobID, engine.ReadBadData)
	case j.Kind == engine.KindRead:
		u.eng.ReadResult(r.id, m.JobID, engine.ReadFailed)
	case m.Code == wire.CodeHashMismatch:
		why := fmt.Errorf("replica %d refused the private copy of write %d: %w", r.id, m.JobID, m.Err())
		r.dropLocked(why, func() { u.eng.Rejected(r.id, m.JobID) })
	default:
		u.log.Warn("replica failed a job", "replica", r.id, "job", m.JobID, "kind", j.Kind, "err", m.Err())
		why := fmt.Errorf("replica %d failed %v %d: %w", r.id, j.Kind, m.JobID, m.Err())
		r.dropLocked(why, func() { u.eng.Failed(r.id, m.JobID) })
	}
	u.stepLocked()
	u.finishLocked()
}
