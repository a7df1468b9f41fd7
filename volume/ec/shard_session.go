package ec

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"

	"tern/volume/dsclient"
	"tern/volume/ids"
	"tern/volume/transport"
	"tern/volume/wire"
)

// errSessionLost: the session to a shard ended before the reply came.
var errSessionLost = errors.New("shard session lost")

// session is one activated read-write session to one shard's downstairs:
// requests are sent in call order on one stream (so the downstairs orders
// overlapping ones as sent) and replies are matched by JobID. Any
// goroutine may call it; one reader goroutine, owned by the session,
// decodes replies until the stream ends. The connection, the handshake
// and the activation are volume/dsclient's.
type session struct {
	// Immutable after dialSession (c is the reader's to receive on once
	// activate started it).
	c          *dsclient.Conn
	region     wire.RegionInfo
	lostWrites bool
	versions   []wire.ExtentVersion
	done       chan struct{} // closed when the reader ends

	// sendTurn serializes sends, so the send order is the call order:
	// a one-slot channel, not a mutex, because its holder may block for
	// long in a stream write (flow control, a silent peer), and a
	// goroutine waiting its turn on a channel is one testing/synctest
	// counts as blocked, so the EC simulation's virtual clock moves on.
	sendTurn chan struct{}

	// dropped is why the volume ended this session, if it did; guarded
	// by Volume.mu.
	dropped error

	mu      sync.Mutex
	next    wire.JobID
	pending map[wire.JobID]*pendingReq
	err     error // why the session ended, once done is closed
}

// pendingReq is one request waiting for its reply.
type pendingReq struct {
	id    wire.JobID
	data  []byte // where a ReadResponse's blocks go (len ≥ the reply's)
	reply chan sessionReply
}

// sessionReply is a reply taken out of the decoder (cloned).
type sessionReply struct {
	msg wire.Message
	err error
}

// sessionParams is what a session needs to say Hello and Activate.
type sessionParams struct {
	target     string
	tls        *tls.Config
	dial       transport.DialOptions
	region     wire.RegionInfo // zero fields accept what the shard serves
	upstairsID uuid.UUID
}

// dialSession connects, says Hello and returns after the HelloReply: the
// region is known, nothing is activated yet. The stream's deadline is
// ctx's.
func dialSession(ctx context.Context, p sessionParams) (*session, error) {
	c, err := dsclient.Dial(ctx, p.target, p.tls, dsclient.Options{Dial: p.dial})
	if err != nil {
		return nil, err
	}
	region, err := c.Hello(dsclient.HelloParams{RegionUUID: p.region.UUID, UpstairsID: p.upstairsID})
	if err != nil {
		c.Close("")
		return nil, err
	}
	if d := regionDiff(p.region, region); d != "" {
		c.Close("")
		return nil, fmt.Errorf("%s: %w", d, ErrRegionMismatch)
	}
	return &session{c: c, region: region, done: make(chan struct{}), sendTurn: make(chan struct{}, 1),
		pending: make(map[wire.JobID]*pendingReq), next: 16}, nil
}

// activate activates the session at gen, reads every extent's version
// and starts the reader. The stream deadline of ctx is lifted after.
func (s *session) activate(ctx context.Context, upstairsID uuid.UUID, gen ids.Generation) error {
	lostWrites, err := s.c.Activate(ctx, upstairsID, gen)
	if err != nil {
		return err
	}
	s.lostWrites = lostWrites
	if s.versions, err = s.c.ExtentVersions(s.region.ExtentCount); err != nil {
		return err
	}
	_ = s.c.SetDeadline(time.Time{})
	s.c.SetDataBuffer(s.dataBuffer)
	go s.readLoop()
	return nil
}

// close ends the session; the reader fails every pending request.
func (s *session) close(reason string) {
	s.c.Close(reason)
}

// call sends req (its JobID is set here) and waits for its reply. A
// ReadResponse's data lands in data when it is large enough. Fenced and
// Error replies come back as errors.
func (s *session) call(ctx context.Context, req wire.Message, data []byte) (wire.Message, error) {
	p, err := s.start(req, data)
	if err != nil {
		return nil, err
	}
	return s.wait(ctx, p)
}

// start sends req; its reply is collected with wait. Requests are on the
// wire in the order start was called.
func (s *session) start(req wire.Message, data []byte) (*pendingReq, error) {
	p := &pendingReq{data: data, reply: make(chan sessionReply, 1)}
	s.sendTurn <- struct{}{}
	s.mu.Lock()
	if s.err != nil {
		err := s.err
		s.mu.Unlock()
		<-s.sendTurn
		return nil, err
	}
	s.next++
	p.id = s.next
	s.pending[p.id] = p
	s.mu.Unlock()
	wire.SetJobID(req, p.id)
	err := s.c.Send(req)
	<-s.sendTurn
	if err != nil {
		s.close("send failed")
		s.forget(p.id)
		return nil, fmt.Errorf("sending %v: %w: %w", req.Type(), errSessionLost, err)
	}
	return p, nil
}

// wait waits for the reply to p; if ctx ends first, p is abandoned.
func (s *session) wait(ctx context.Context, p *pendingReq) (wire.Message, error) {
	select {
	case r := <-p.reply:
		return r.msg, r.err
	case <-ctx.Done():
		s.forget(p.id)
		return nil, ctx.Err()
	}
}

// forget drops a pending request nobody waits for any more.
func (s *session) forget(id wire.JobID) {
	s.mu.Lock()
	delete(s.pending, id)
	s.mu.Unlock()
}

// dataBuffer lets a ReadResponse land in its caller's buffer; it runs on
// the reader goroutine.
func (s *session) dataBuffer(t wire.MsgType, id wire.JobID, n int) []byte {
	if t != wire.TypeReadResponse {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if p := s.pending[id]; p != nil && len(p.data) >= n {
		return p.data[:n]
	}
	return nil
}

// readLoop hands each reply to its request until the stream ends, then
// fails what is left.
func (s *session) readLoop() {
	var err error
	for {
		var m wire.Message
		if m, err = s.c.Receive(); err != nil {
			break
		}
		id, _ := wire.JobOf(m)
		if f, ok := m.(*wire.Fenced); ok && id == 0 {
			err = fmt.Errorf("generation %d took over: %w", f.ByGen, ErrFenced)
			break
		}
		s.mu.Lock()
		p := s.pending[id]
		delete(s.pending, id)
		s.mu.Unlock()
		if p == nil {
			continue // abandoned by its caller
		}
		p.reply <- toReply(m, p.data)
	}
	s.c.Close("")
	s.mu.Lock()
	s.err = fmt.Errorf("%w: %w", errSessionLost, err)
	for id, p := range s.pending {
		p.reply <- sessionReply{err: s.err}
		delete(s.pending, id)
	}
	s.mu.Unlock()
	close(s.done)
}

// toReply copies a decoded reply out of the decoder's buffers (bulk data
// already in data is kept there).
func toReply(m wire.Message, data []byte) sessionReply {
	switch m := m.(type) {
	case *wire.Error:
		return sessionReply{err: m.Err()}
	case *wire.Fenced:
		return sessionReply{err: fmt.Errorf("generation %d took over: %w", m.ByGen, ErrFenced)}
	case *wire.ReadResponse:
		r := &wire.ReadResponse{JobID: m.JobID, Hashes: append([]uint64(nil), m.Hashes...)}
		if len(m.Data) > 0 && len(data) >= len(m.Data) && &data[0] == &m.Data[0] {
			r.Data = data[:len(m.Data)]
		} else {
			r.Data = append([]byte(nil), m.Data...)
		}
		return sessionReply{msg: r}
	}
	return sessionReply{msg: wire.Clone(m)}
}

// regionDiff names the first difference between the region asked for
// (zero fields accept anything) and the one served, "" when none.
func regionDiff(want, got wire.RegionInfo) string {
	switch {
	case want.UUID != uuid.Nil && want.UUID != got.UUID:
		return fmt.Sprintf("region uuid %v, want %v", got.UUID, want.UUID)
	case want.BlockSize != 0 && want.BlockSize != got.BlockSize:
		return fmt.Sprintf("block size %d, want %d", got.BlockSize, want.BlockSize)
	case want.ExtentBlocks != 0 && want.ExtentBlocks != got.ExtentBlocks:
		return fmt.Sprintf("extent blocks %d, want %d", got.ExtentBlocks, want.ExtentBlocks)
	case want.ExtentCount != 0 && want.ExtentCount != got.ExtentCount:
		return fmt.Sprintf("extent count %d, want %d", got.ExtentCount, want.ExtentCount)
	}
	return ""
}
