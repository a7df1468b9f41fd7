package upstairs

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"tern/volume/dsclient"
	"tern/volume/wire"
)

// ErrNoSession: the replica has no session to carry a call (it is not
// connected, or its session ended before the reply came).
var ErrNoSession = errors.New("replica has no session")

// call is one request to one replica's session outside the job engine
// (repair traffic: extent hashes, repair reads and writes). It is sent in
// the session's order among the engine's jobs, and answered by the reply
// carrying its JobID.
type call struct {
	req     wire.Message
	id      wire.JobID
	replica int
	data    []byte // where a RepairData reply's blocks go (may be nil)
	// Guarded by Upstairs.mu.
	abandoned bool
	reply     chan callResult // one result, buffered
}

type callResult struct {
	msg wire.Message
	err error
}

// callReplica sends req (its JobID is assigned here) on replica r's
// session and waits for the reply, which the caller owns. A RepairData
// reply's block data lands in data when it is large enough. This is the
// seam for repair drivers; the engine's jobs are not involved, but a call
// is sent only after every job queued to r before it (sendPending), so a
// call follows the guest IO submitted before it.
func (u *Upstairs) callReplica(ctx context.Context, r int, req wire.Message, data []byte) (wire.Message, error) {
	c, err := u.startCall(r, 0, req, data)
	if err != nil {
		return nil, err
	}
	return u.waitCall(ctx, c)
}

// startCall queues req on replica r's session without waiting, so a
// repair can keep several requests in flight. A non-zero epoch pins the
// call to that session of r (see sessionEpoch): a later session refuses
// it with ErrNoSession, so a repair never carries on across a reconnect.
// The caller must waitCall or abandonCall it.
func (u *Upstairs) startCall(r int, epoch uint64, req wire.Message, data []byte) (*call, error) {
	c := &call{req: req, data: data, reply: make(chan callResult, 1), replica: r}
	u.mu.Lock()
	defer u.mu.Unlock()
	rep := u.replicas[r]
	if !rep.serving || epoch != 0 && rep.epoch != epoch {
		return nil, fmt.Errorf("calling replica %d: %w", r, ErrNoSession)
	}
	c.id = u.eng.AllocID()
	if !wire.SetJobID(req, c.id) {
		return nil, fmt.Errorf("calling replica %d: %v is not a request", r, req.Type())
	}
	rep.calls = append(rep.calls, c)
	rep.wakeUp()
	return c, nil
}

// waitCall waits for the reply to c; if ctx ends first, c is abandoned.
func (u *Upstairs) waitCall(ctx context.Context, c *call) (wire.Message, error) {
	select {
	case res := <-c.reply:
		return res.msg, res.err
	case <-ctx.Done():
		u.abandonCall(c)
		return nil, fmt.Errorf("calling replica %d: %w", c.replica, ctx.Err())
	}
}

// abandonCall gives up on c: it is not sent if still queued, and a reply's
// bulk data no longer lands in its buffer once the decoder has not
// already chosen it.
func (u *Upstairs) abandonCall(c *call) {
	u.mu.Lock()
	defer u.mu.Unlock()
	c.abandoned = true
	rep := u.replicas[c.replica]
	if i := slices.Index(rep.calls, c); i >= 0 {
		rep.calls = slices.Delete(rep.calls, i, i+1)
	}
}

// sendCall sends the first queued call of this replica; run by its owner
// goroutine.
func (r *replica) sendCall(conn *dsclient.Conn) error {
	u := r.u
	u.mu.Lock()
	if len(r.calls) == 0 {
		u.mu.Unlock()
		return nil
	}
	c := r.calls[0]
	r.calls = slices.Delete(r.calls, 0, 1)
	if r.inflight == nil {
		r.inflight = make(map[wire.JobID]*call)
	}
	r.inflight[c.id] = c
	r.noteSentLocked(c.id)
	u.mu.Unlock()
	if err := conn.Send(c.req); err != nil {
		return fmt.Errorf("sending call to replica %d: %w", r.id, err)
	}
	return nil
}

// answer hands reply m to its call, which checkReply took out of
// inflight (copied: the decoder reuses m).
func (r *replica) answer(c *call, m wire.Message) {
	res := callResult{msg: cloneReply(m, c.data)}
	if e, ok := m.(*wire.Error); ok {
		res.err = fmt.Errorf("replica %d: %w", r.id, e.Err())
	}
	c.reply <- res
}

// endCalls fails every call of a session that ended.
func (r *replica) endCalls(err error) {
	u := r.u
	u.mu.Lock()
	defer u.mu.Unlock()
	r.serving = false
	for _, c := range r.calls {
		c.reply <- callResult{err: fmt.Errorf("replica %d: %w: %w", r.id, ErrNoSession, err)}
	}
	r.calls = r.calls[:0]
	for id, c := range r.inflight {
		c.reply <- callResult{err: fmt.Errorf("replica %d: %w: %w", r.id, ErrNoSession, err)}
		delete(r.inflight, id)
	}
}

// callData is the DataBuffer choice for a call's bulk reply.
func (r *replica) callData(id wire.JobID, n int) []byte {
	return callBuffer(r.inflight, id, n)
}

// callBuffer is where n bytes of bulk data answering call id go: the
// call's buffer if it is in flight, still wanted and large enough, else
// nil (the decoder's own).
func callBuffer(inflight map[wire.JobID]*call, id wire.JobID, n int) []byte {
	c := inflight[id]
	if c == nil || c.abandoned || len(c.data) < n {
		return nil
	}
	return c.data[:n]
}

// cloneReply copies a decoded reply out of the decoder's buffers. Bulk
// data already in data (chosen by callData) is referenced, not copied.
func cloneReply(m wire.Message, data []byte) wire.Message {
	if r, ok := m.(*wire.RepairData); ok && len(r.Data) > 0 && len(data) >= len(r.Data) && &data[0] == &r.Data[0] {
		c := *r
		c.Blocks, c.Hashes = slices.Clone(r.Blocks), slices.Clone(r.Hashes)
		return &c
	}
	return wire.Clone(m)
}
