package downstairs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/quic-go/quic-go"

	"tern/volume/ids"
	"tern/volume/wire"
)

// Timeouts of a session's edges.
const (
	// helloTimeout bounds the wait for the session stream and its Hello.
	helloTimeout = 10 * time.Second
	// lingerTimeout bounds how long a closing session waits for the peer
	// to read its last replies and close the connection.
	lingerTimeout = 5 * time.Second
)

// QUIC application error codes the downstairs closes connections with.
const (
	closeNormal      quic.ApplicationErrorCode = 0
	closeProtocol    quic.ApplicationErrorCode = 1
	closeShutdown    quic.ApplicationErrorCode = 2
	closeHandshake   quic.ApplicationErrorCode = 3
	closeWriteFailed quic.ApplicationErrorCode = 4
)

// session serves one upstairs connection. Its owner goroutine (run) holds
// all ordering state; a reader goroutine decodes requests into jobs, the
// server's workers execute them, and a writer goroutine encodes replies.
//
//	reader ──incoming──▶ owner ──srv.work──▶ workers
//	                       ▲  ◀─completions──┘
//	                       └──queue──▶ writer ──▶ stream
type session struct {
	// Immutable after the handshake.
	srv       *Server
	conn      *quic.Conn
	stream    *quic.Stream
	log       *slog.Logger
	readOnly  bool
	upstairs  uuid.UUID
	sessionID uuid.UUID

	gen ids.Generation // guarded by srv.fence.mu: the activation generation

	fenced    atomic.Pointer[fenceInfo] // set once when fenced
	fenceNote chan struct{}             // one-slot: fenced, tell the peer

	incoming    chan *job     // reader → owner
	completions chan *job     // workers → owner; capacity maxJobs, never blocks
	slots       chan struct{} // one per request between decode and reply

	// Owner-only state.
	eng      *engine
	jobs     map[wire.JobID]*job // jobs in the engine
	inflight int                 // jobs handed to workers, not yet completed

	// Writer queue.
	qmu    sync.Mutex
	queue  []*job // guarded by qmu
	qnote  chan struct{}
	qfinal chan struct{} // closed by the owner: no more replies will come
}

// fencedBy returns who fenced the session, or nil.
func (s *session) fencedBy() *fenceInfo { return s.fenced.Load() }

// fence marks the session fenced and wakes its owner to tell the peer.
// Called with srv.fence.mu held.
func (s *session) fence(f *fenceInfo) {
	if s.fenced.CompareAndSwap(nil, f) {
		select {
		case s.fenceNote <- struct{}{}:
		default:
		}
	}
}

// serveConn runs one connection to its end and closes it.
func (srv *Server) serveConn(ctx context.Context, conn *quic.Conn) {
	s := &session{
		srv:         srv,
		conn:        conn,
		log:         srv.log.With("remote", conn.RemoteAddr().String()),
		fenceNote:   make(chan struct{}, 1),
		incoming:    make(chan *job),
		completions: make(chan *job, srv.maxJobs),
		slots:       make(chan struct{}, srv.maxJobs),
		eng:         newEngine(),
		jobs:        make(map[wire.JobID]*job),
		qnote:       make(chan struct{}, 1),
		qfinal:      make(chan struct{}),
	}
	dec, enc, err := s.handshake(ctx)
	if err != nil {
		s.log.Info("session refused", "err", err)
		return
	}
	srv.metrics.sessions.Add(1)
	defer srv.metrics.sessions.Add(-1)
	s.log = s.log.With("upstairs", s.upstairs, "session", s.sessionID, "read_only", s.readOnly)
	s.log.Info("session started")
	err = s.run(ctx, dec, enc)
	srv.deactivate(s)
	if closedNormally(err) {
		s.log.Info("session ended")
	} else {
		s.log.Info("session ended", "err", err)
	}
}

// closedNormally reports whether a session's error is the peer closing the
// connection with application code 0, which both the upstairs and a
// read-only probe do when they are done: the end of a session, not a
// failure worth an err field in the log.
func closedNormally(err error) bool {
	var appErr *quic.ApplicationError
	return err == nil || errors.As(err, &appErr) && appErr.Remote && appErr.ErrorCode == 0
}

// handshake accepts the session stream and answers its Hello. On failure
// it has told the peer why (when it could) and closed the connection.
func (s *session) handshake(ctx context.Context) (*wire.Decoder, *wire.Encoder, error) {
	hctx, cancel := context.WithTimeout(ctx, helloTimeout)
	defer cancel()
	stream, err := s.conn.AcceptStream(hctx)
	if err != nil {
		s.conn.CloseWithError(closeHandshake, "no session stream")
		return nil, nil, fmt.Errorf("accept session stream: %w", err)
	}
	s.stream = stream
	dec, enc := wire.NewDecoder(stream), wire.NewEncoder(stream)
	stream.SetReadDeadline(time.Now().Add(helloTimeout))
	m, err := dec.Next()
	stream.SetReadDeadline(time.Time{})
	if err != nil {
		s.conn.CloseWithError(closeHandshake, "no hello")
		return nil, nil, fmt.Errorf("read hello: %w", err)
	}
	hello, ok := m.(*wire.Hello)
	if !ok {
		return nil, nil, s.refuse(enc, wire.CodeBadRequest, fmt.Sprintf("first message is %v, want Hello", m.Type()))
	}
	version, ok := wire.ChooseVersion(hello.Versions)
	if !ok {
		return nil, nil, s.refuse(enc, wire.CodeVersionMismatch, fmt.Sprintf("client speaks %v, server speaks %v", hello.Versions, wire.SupportedVersions))
	}
	spec := s.srv.spec
	if hello.RegionUUID != uuid.Nil && hello.RegionUUID != spec.UUID {
		return nil, nil, s.refuse(enc, wire.CodeRegionMismatch, fmt.Sprintf("region is %v, client wants %v", spec.UUID, hello.RegionUUID))
	}
	s.readOnly, s.upstairs, s.sessionID = hello.ReadOnly, hello.UpstairsID, hello.SessionID
	reply := &wire.HelloReply{Version: version, Region: s.srv.regionInfo()}
	if err := enc.Encode(reply); err != nil {
		s.conn.CloseWithError(closeHandshake, "write failed")
		return nil, nil, fmt.Errorf("send hello reply: %w", err)
	}
	return dec, enc, nil
}

// refuse sends a session-level Error, lets the peer read it, and closes.
func (s *session) refuse(enc *wire.Encoder, code wire.ErrorCode, msg string) error {
	err := enc.Encode(&wire.Error{Code: code, Message: msg})
	s.stream.Close()
	s.linger()
	s.conn.CloseWithError(closeHandshake, code.Error())
	if err != nil {
		return fmt.Errorf("refuse session (%v): %w", code, err)
	}
	return fmt.Errorf("refuse session: %w: %s", code, msg)
}

// linger waits, bounded, for the peer to finish reading and close the
// connection, so replies written just before a close are delivered.
func (s *session) linger() {
	t := time.NewTimer(lingerTimeout)
	defer t.Stop()
	select {
	case <-s.conn.Context().Done():
	case <-t.C:
	}
}

// run is the owner goroutine's loop. It returns when the peer has gone (or
// the server stops) and every job handed to a worker has completed.
func (s *session) run(ctx context.Context, dec *wire.Decoder, enc *wire.Encoder) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	readerDone := make(chan error, 1)
	writerDone := make(chan error, 1)
	go func() { readerDone <- s.readLoop(ctx, dec) }()
	go func() { writerDone <- s.writeLoop(enc, cancel) }()

	var readErr error
	reading := true
	stopping := ctx.Done()
	for reading || s.inflight > 0 {
		select {
		case j := <-s.incoming:
			s.handle(j)
		case j := <-s.completions:
			s.complete(j)
		case <-s.fenceNote:
			s.notifyFenced()
		case readErr = <-readerDone:
			reading = false
			if !errors.Is(readErr, io.EOF) {
				// The stream broke: nobody will read the replies of jobs
				// not started yet. After a clean end of the request
				// stream they still run and are answered.
				s.dropWaiting()
			}
		case <-stopping:
			// Server shutdown or writer failure: stop reading, finish the
			// jobs already running, drop the rest.
			stopping = nil
			s.conn.CloseWithError(closeShutdown, "downstairs stopping")
			s.dropWaiting()
		}
	}
	close(s.qfinal)
	writeErr := <-writerDone
	if ctx.Err() == nil {
		s.stream.Close()
		s.linger()
	}
	s.conn.CloseWithError(closeNormal, "")
	if errors.Is(readErr, io.EOF) || errors.Is(readErr, context.Canceled) {
		readErr = nil
	}
	return errors.Join(readErr, writeErr)
}

// handle admits one decoded request: checks what the session may do, and
// either answers at once or hands the job to the engine.
func (s *session) handle(j *job) {
	srv := s.srv
	if j.failed {
		s.reply(j)
		return
	}
	switch j.kind {
	case kindActivate:
		if s.readOnly {
			j.fail(wire.CodeReadOnly, "read-only sessions do not activate")
		} else if res := srv.activate(s, j.gen); res.fenced != nil {
			j.fenced = res.fenced
		} else if !res.ok {
			j.fail(res.code, "%s", res.msg)
		} else {
			j.lostWrites = srv.region.MayHaveLostWrites()
		}
		s.reply(j)
		return
	case kindRegionInfo:
		s.reply(j)
		return
	}
	// Read active before fenced: a takeover sets the victim's fence before
	// releasing the lock isActive takes, so a session found inactive
	// because of a takeover is also found fenced.
	active := srv.isActive(s)
	if f := s.fencedBy(); f != nil {
		j.fenced = f
		s.reply(j)
		return
	}
	var sessionGen ids.Generation
	if j.kind == kindFlush {
		sessionGen = srv.sessionGen(s)
	}
	switch code, ok := admit(j.kind, s.readOnly, active, j.gen, sessionGen); {
	case ok:
	case code == wire.CodeReadOnly:
		j.fail(code, "%s on a read-only session", kindNames[j.kind])
	case code == wire.CodeNotActive:
		j.fail(code, "%s before Activate", kindNames[j.kind])
	default:
		j.fail(code, "flush generation %d is not the session's %d", j.gen, sessionGen)
	}
	if j.failed {
		s.reply(j)
		return
	}
	run, ok := s.eng.submit(j.key(srv.spec))
	if !ok {
		j.fail(wire.CodeBadRequest, "job %d is already pending", j.id)
		s.reply(j)
		return
	}
	s.jobs[j.id] = j
	if run {
		s.dispatch(j)
	}
}

// dispatch hands a runnable job to the worker pool. Workers never block on
// the session (completions has room for every job), so this send always
// completes.
func (s *session) dispatch(j *job) {
	s.inflight++
	s.srv.work <- j
}

// complete retires a job a worker finished, starts what it unblocked and
// queues its reply.
func (s *session) complete(j *job) {
	s.inflight--
	delete(s.jobs, j.id)
	for _, id := range s.eng.complete(j.id) {
		s.dispatch(s.jobs[id])
	}
	s.reply(j)
}

// dropWaiting discards jobs that have not started: the peer is gone.
func (s *session) dropWaiting() {
	for _, id := range s.eng.drop() {
		j := s.jobs[id]
		delete(s.jobs, id)
		j.release(&s.srv.bufs)
	}
}

// notifyFenced queues an unsolicited Fenced for the peer.
func (s *session) notifyFenced() {
	f := s.fencedBy()
	if f == nil {
		return
	}
	j := newJob(s, kindNotice, 0, nil)
	j.fenced = f
	s.log.Info("fenced", "by_gen", f.gen, "by_upstairs", f.by)
	s.reply(j)
}

// reply queues j for the writer.
func (s *session) reply(j *job) {
	s.qmu.Lock()
	s.queue = append(s.queue, j)
	s.qmu.Unlock()
	select {
	case s.qnote <- struct{}{}:
	default:
	}
}

// readLoop decodes requests until the stream ends. Each request takes a
// slot first, which bounds the jobs a session holds (and their buffers).
func (s *session) readLoop(ctx context.Context, dec *wire.Decoder) error {
	var dataBuf *[]byte // buffer handed to the decoder for the current frame
	dec.DataBuffer = func(t wire.MsgType, _ wire.JobID, n int) []byte {
		if (t != wire.TypeWrite && t != wire.TypeRepairWrite) || n > wire.MaxDataSize {
			return nil
		}
		dataBuf = s.srv.bufs.get(n)
		return *dataBuf
	}
	for {
		select {
		case s.slots <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
		m, err := dec.Next()
		if err != nil {
			s.srv.bufs.put(dataBuf)
			return err
		}
		j := s.toJob(m, dataBuf)
		dataBuf = nil
		select {
		case s.incoming <- j:
		case <-ctx.Done():
			j.release(&s.srv.bufs)
			return ctx.Err()
		}
	}
}

// writeLoop encodes queued replies until the owner closes qfinal and the
// queue is empty. After a write error it keeps releasing replies without
// sending them, and cancels the session.
func (s *session) writeLoop(enc *wire.Encoder, cancel context.CancelFunc) error {
	var (
		batch    []*job
		writeErr error
		out      replyEncoder
	)
	for {
		s.qmu.Lock()
		batch, s.queue = s.queue, batch[:0]
		s.qmu.Unlock()
		for i, j := range batch {
			if writeErr == nil {
				if err := out.encode(enc, j, s.srv.spec); err != nil {
					writeErr = fmt.Errorf("send reply: %w", err)
					cancel()
				}
			}
			s.srv.metrics.observe(j)
			if j.kind != kindNotice {
				<-s.slots
			}
			j.release(&s.srv.bufs)
			batch[i] = nil
		}
		if len(batch) > 0 {
			continue
		}
		select {
		case <-s.qnote:
		case <-s.qfinal:
			s.qmu.Lock()
			empty := len(s.queue) == 0
			s.qmu.Unlock()
			if empty {
				return writeErr
			}
		}
	}
}
