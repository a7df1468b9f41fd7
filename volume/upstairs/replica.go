package upstairs

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/quic-go/quic-go"

	"tern/volume/ids"
	"tern/volume/transport"
	"tern/volume/upstairs/engine"
	"tern/volume/wire"
)

// replica drives the connection to one downstairs. Its run goroutine owns
// the connection and everything on it: it dials, negotiates, activates,
// sends jobs, and on any failure tears the session down and redials with
// backoff. A helper goroutine it starts and waits for decodes replies.
type replica struct {
	// Immutable.
	u    *Upstairs
	id   int
	wake chan struct{} // one-slot notify: jobs queued or state changed

	// Owned by the run goroutine.
	target   string // address of the current session (Upstairs.targets[id] when it began)
	deps     []wire.JobID
	writeMsg wire.Write
	readMsg  wire.Read
	flushMsg wire.Flush

	// Owned by the reader goroutine.
	landed    wire.JobID // read whose data the decoder put in the caller's buffer
	landedBuf []byte
	blockSize int

	// Guarded by u.mu.
	lastErr error
	// cause is why the driver is taking this replica out of service, set
	// for the engine call that does it (dropLocked).
	cause error
	// faultReason is why the replica last left service, faultFirst why
	// it first did since it was last Active, and faultedAt when; all
	// cleared once it is Active again (noteFaultLocked).
	faultReason error
	faultFirst  error
	faultedAt   time.Time
	serving     bool                 // a session is in its serving phase (calls accepted)
	held        bool                 // that session is held for a restart reconciliation (restart_reconcile.go)
	epoch       uint64               // counts serving sessions; pins repair calls to one
	calls       []*call              // calls waiting to be sent
	inflight    map[wire.JobID]*call // calls sent, reply outstanding
	// sent are the engine's jobs sent on this session and not answered
	// yet: a reply must match one of them (or an inflight call) exactly
	// once, in type and size. sendOrder lists them and the calls in send
	// order for the reply timeout (answered entries are dropped lazily).
	sent      map[wire.JobID]sentJob
	sendOrder []sentAt
}

// sentJob is what the reply to a job sent on a session must look like.
type sentJob struct {
	kind  engine.JobKind
	bytes int // a read's data
}

// sentAt is when a job or call went out on a session.
type sentAt struct {
	id wire.JobID
	at time.Time
}

// errSessionEnded ends a session without a fault of the connection: the
// replica stopped taking IO (faulted, stopped).
var errSessionEnded = errors.New("session ended")

// Control messages of a session use job IDs below the engine's first.
const (
	activateJobID wire.JobID = 1
	versionsJobID wire.JobID = 2
)

func newReplica(u *Upstairs, id int) *replica {
	return &replica{u: u, id: id, wake: make(chan struct{}, 1)}
}

func (r *replica) wakeUp() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

func (r *replica) lastErrLocked() string {
	if r.lastErr == nil {
		return ""
	}
	return r.lastErr.Error()
}

// stateRunning returns the engine's state of this replica and whether the
// volume is running (activated, not stopped).
func (r *replica) stateRunning() (engine.ReplicaState, bool) {
	r.u.mu.Lock()
	defer r.u.mu.Unlock()
	return r.u.eng.State(r.id), r.u.eng.Running()
}

// sleep waits d; false when the upstairs closes first.
func (r *replica) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-r.u.ctx.Done():
		return false
	}
}

// run is the replica's owner goroutine; it ends when the upstairs closes.
func (r *replica) run() {
	u := r.u
	defer u.wg.Done()
	backoff := u.cfg.ReconnectMin
	for u.ctx.Err() == nil {
		// A faulted replica gets no IO until live repair brings it back:
		// while the volume runs it keeps trying (with backoff) to reach
		// its downstairs, whose session then starts the repair.
		switch st, running := r.stateRunning(); {
		case st == engine.ReplicaStopped, st == engine.ReplicaFaulted && !running:
			select {
			case <-r.wake:
			case <-u.ctx.Done():
			}
			continue
		case st == engine.ReplicaFaulted:
			if !r.sleep(backoff) {
				return
			}
			backoff = min(2*backoff, u.cfg.ReconnectMax)
		}
		began := time.Now()
		err := r.session(u.ctx)
		if u.ctx.Err() != nil {
			return
		}
		u.mu.Lock()
		r.lastErr = err
		u.mu.Unlock()
		if errors.Is(err, errSessionEnded) {
			continue
		}
		u.log.Warn("downstairs session ended", "replica", r.id, "target", r.target, "err", err)
		if time.Since(began) > 4*u.cfg.ReconnectMax {
			backoff = u.cfg.ReconnectMin
		}
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-u.ctx.Done():
			t.Stop()
		}
		backoff = min(2*backoff, u.cfg.ReconnectMax)
	}
}

// session runs one connection from dial to teardown.
func (r *replica) session(ctx context.Context) error {
	u := r.u
	u.mu.Lock()
	r.target = u.targets[r.id]
	u.mu.Unlock()
	conn, err := transport.DialWith(ctx, r.target, u.cfg.TLS, transport.DialOptions{
		KeepAlivePeriod: u.cfg.KeepAlivePeriod,
		IdleTimeout:     u.cfg.IdleTimeout,
	})
	if err != nil {
		return fmt.Errorf("connecting replica %d: %w", r.id, err)
	}
	defer func() {
		_ = conn.CloseWithError(0, "session closed")
	}()
	// Closing the connection is how a blocked read or write is interrupted.
	stopClose := context.AfterFunc(ctx, func() { _ = conn.CloseWithError(0, "upstairs closing") })
	defer stopClose()
	stream, err := conn.OpenStreamSync(ctx)
	if err != nil {
		return fmt.Errorf("opening session stream to replica %d: %w", r.id, err)
	}
	enc, dec := wire.NewEncoder(stream), wire.NewDecoder(stream)
	if err := r.negotiate(ctx, enc, r.timedDecoder(stream, dec)); err != nil {
		return err
	}
	// From here on the reply timeout is the serve loop's.
	if err := stream.SetReadDeadline(time.Time{}); err != nil {
		return fmt.Errorf("replica %d: %w", r.id, err)
	}
	return r.serve(conn, enc, dec)
}

// negotiate says Hello, compares the region, activates with the upstairs'
// generation and reports the session to the upstairs (Activate's
// bookkeeping the first time, replay afterwards).
func (r *replica) negotiate(ctx context.Context, enc *wire.Encoder, dec replyReader) error {
	u := r.u
	sessionID := uuid.New()
	hello := &wire.Hello{
		Versions:   wire.SupportedVersions,
		RegionUUID: u.cfg.Region.UUID,
		UpstairsID: u.cfg.UpstairsID,
		SessionID:  sessionID,
	}
	if err := enc.Encode(hello); err != nil {
		return fmt.Errorf("greeting replica %d: %w", r.id, err)
	}
	m, err := dec.Next()
	if err != nil {
		return fmt.Errorf("reading hello reply from replica %d: %w", r.id, err)
	}
	var region wire.RegionInfo
	switch m := m.(type) {
	case *wire.HelloReply:
		region = m.Region
		if err := checkGeometry(region); err != nil {
			return r.invalidRegion(fmt.Errorf("replica %d (%s) serves an invalid region: %w", r.id, r.target, err))
		}
	case *wire.Error:
		err := fmt.Errorf("replica %d (%s) refused hello: %w", r.id, r.target, m.Err())
		if m.Code == wire.CodeRegionMismatch {
			err = fmt.Errorf("%w: %w", ErrRegionMismatch, err)
		}
		return r.activationFailed(err)
	default:
		return fmt.Errorf("replica %d answered hello with %v", r.id, m.Type())
	}

	gen, err := r.await(ctx, region)
	if err != nil {
		return err
	}
	if err := enc.Encode(&wire.Activate{JobID: activateJobID, UpstairsID: u.cfg.UpstairsID, SessionID: sessionID, Gen: gen}); err != nil {
		return fmt.Errorf("activating replica %d: %w", r.id, err)
	}
	if m, err = dec.Next(); err != nil {
		return fmt.Errorf("reading activation reply from replica %d: %w", r.id, err)
	}
	lostWrites := false
	switch m := m.(type) {
	case *wire.ActivateAck:
		lostWrites = m.LostWrites
	case *wire.Fenced:
		err := fmt.Errorf("replica %d was activated by generation %d: %w", r.id, m.ByGen, ErrFenced)
		r.fenceOrFail(m.ByGen, err)
		return err
	case *wire.Error:
		err := fmt.Errorf("replica %d (%s) refused generation %d: %w", r.id, r.target, gen, m.Err())
		switch m.Code {
		case wire.CodeFenced:
			err = fmt.Errorf("%w: %w", ErrFenced, err)
			r.fenceOrFail(0, err)
		case wire.CodeGenTooLow:
			err = fmt.Errorf("%w: %w", ErrGenTooLow, err)
			r.refusedGen(err)
		}
		return err
	default:
		return fmt.Errorf("replica %d answered activation with %v", r.id, m.Type())
	}
	versions, err := r.extentVersions(enc, dec, region)
	if err != nil {
		return err
	}
	return r.activated(versions, lostWrites)
}

// await reports the negotiated region and returns the generation to
// activate with once the upstairs lets this replica go ahead.
func (r *replica) await(ctx context.Context, region wire.RegionInfo) (ids.Generation, error) {
	u := r.u
	u.mu.Lock()
	a := u.act
	if a == nil {
		u.mu.Unlock()
		return 0, errSessionEnded
	}
	if !a.decided {
		a.region[r.id] = &region
		a.notifyLocked()
		proceed := a.proceed
		u.mu.Unlock()
		select {
		case <-proceed:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
		u.mu.Lock()
	}
	defer u.mu.Unlock()
	for a.region[r.id] == nil && !u.eng.Running() && u.eng.StopErr() == nil {
		// Activation went ahead without this replica and has not started
		// IO yet (it is reconciling): wait, then join by live repair.
		ch := a.changed
		u.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			u.mu.Lock()
			return 0, ctx.Err()
		}
		u.mu.Lock()
	}
	if d := regionDiff(u.region, region); d != "" {
		// A replica that comes back serving another region is not one
		// of ours any more.
		err := fmt.Errorf("replica %d (%s): %s: %w", r.id, r.target, d, ErrRegionMismatch)
		r.dropLocked(err, func() { u.eng.Fault(r.id) })
		return 0, err
	}
	st := u.eng.State(r.id)
	if st == engine.ReplicaFaulted && u.eng.Running() {
		// Reachable and serving our region: live repair takes it over
		// once this session is activated.
		u.eng.RepairStarted(r.id)
		u.stepLocked()
		st = u.eng.State(r.id)
	}
	if st == engine.ReplicaFaulted || st == engine.ReplicaStopped || a.region[r.id] == nil && st != engine.ReplicaRepairing {
		return 0, errSessionEnded
	}
	return u.gen, nil
}

// extentVersions reads every extent's version.
func (r *replica) extentVersions(enc *wire.Encoder, dec replyReader, region wire.RegionInfo) ([]wire.ExtentVersion, error) {
	versions := make([]wire.ExtentVersion, 0, region.ExtentCount)
	for uint32(len(versions)) < region.ExtentCount {
		req := &wire.ExtentVersionsRequest{JobID: versionsJobID, First: ids.ExtentID(len(versions))}
		if err := enc.Encode(req); err != nil {
			return nil, fmt.Errorf("asking replica %d for extent versions: %w", r.id, err)
		}
		m, err := dec.Next()
		if err != nil {
			return nil, fmt.Errorf("reading extent versions from replica %d: %w", r.id, err)
		}
		ev, ok := m.(*wire.ExtentVersions)
		if !ok || ev.First != req.First || len(ev.Versions) == 0 {
			return nil, fmt.Errorf("replica %d answered extent versions with %v", r.id, m.Type())
		}
		versions = append(versions, ev.Versions...)
	}
	return versions[:region.ExtentCount], nil
}

// activated reports an activated session: to Activate during activation,
// to the engine on a reconnect, which decides (Engine.Rejoin): an intact
// Offline replica is replayed its backlog. One that needs repair — it may
// have lost writes (it crashed with unflushed writes, which the engine
// retired once every replica acknowledged them, so a replay cannot bring
// them back), or it is Repairing — is live-repaired from an Active peer,
// or, when no peer is Active (every replica restarted), held for a
// restart reconciliation (restart_reconcile.go).
func (r *replica) activated(versions []wire.ExtentVersion, lostWrites bool) error {
	u := r.u
	u.mu.Lock()
	a := u.act
	// The session serves calls from now on (serve sends them).
	r.serving = true
	r.epoch++
	if !u.eng.Running() && u.eng.StopErr() == nil {
		a.done[r.id] = true
		a.versions[r.id] = versions
		a.notifyLocked()
		// The session serves calls (activation repair) at once; the
		// engine's jobs flow once Activate starts IO.
		u.mu.Unlock()
		return nil
	}
	if u.eng.State(r.id) == engine.ReplicaOffline {
		u.eng.FlushedOn(r.id, flushedAt(versions, u.gen))
	}
	switch u.eng.Rejoin(r.id, lostWrites) {
	case engine.RejoinRepair:
		if u.eng.State(r.id) == engine.ReplicaOffline {
			u.log.Warn("replica restarted and may have lost unflushed writes; repairing it instead of replaying", "replica", r.id, "target", r.target)
			u.faultForRepairLocked(r.id, fmt.Errorf("replica %d restarted and may have lost unflushed writes", r.id))
		}
	case engine.RejoinHold:
		u.holdLocked(r.id)
		u.stepLocked()
		u.finishLocked()
		return nil
	}
	u.eng.Connected(r.id)
	u.startLiveRepairLocked(r.id, r.epoch)
	u.stepLocked()
	u.finishLocked()
	return nil
}

// activationFailed records err for Activate if it is still waiting.
func (r *replica) activationFailed(err error) error {
	u := r.u
	u.mu.Lock()
	defer u.mu.Unlock()
	if a := u.act; a != nil && !u.eng.Running() {
		a.err[r.id] = err
		a.notifyLocked()
	} else if errors.Is(err, ErrRegionMismatch) {
		r.dropLocked(err, func() { u.eng.Fault(r.id) })
	}
	return err
}

// refusedGen handles a downstairs refusing our generation: during
// activation the activation fails; on a reconnect the replica cannot rejoin
// this activation and is faulted (needs repair). If another upstairs took
// the region over, the other replicas' sessions fence us.
func (r *replica) refusedGen(err error) {
	u := r.u
	u.mu.Lock()
	if !u.eng.Running() {
		u.mu.Unlock()
		_ = r.activationFailed(err)
		return
	}
	u.log.Error("replica refused to rejoin the activation; it needs repair", "replica", r.id, "target", r.target, "err", err)
	r.dropLocked(err, func() { u.eng.Fault(r.id) })
	u.finishLocked()
}

// fenceOrFail fences the running upstairs, or fails the activation.
func (r *replica) fenceOrFail(byGen ids.Generation, err error) {
	u := r.u
	u.mu.Lock()
	running := u.eng.Running()
	u.mu.Unlock()
	if running {
		u.fence(r.id, byGen)
		return
	}
	_ = r.activationFailed(err)
}

// serve runs the IO phase of a session: this goroutine sends, a helper
// decodes replies. It returns when the connection fails, the replica stops
// taking IO or the upstairs closes, after the helper has ended and the
// engine has been told.
func (r *replica) serve(conn *quic.Conn, enc *wire.Encoder, dec *wire.Decoder) error {
	u := r.u
	r.blockSize = u.blockSize // fixed once activated
	u.mu.Lock()
	r.resetSentLocked()
	u.mu.Unlock()
	readerDone := make(chan error, 1)
	go func() { readerDone <- r.readLoop(dec) }()
	replyTimer := time.NewTimer(u.cfg.ReplyTimeout)
	defer replyTimer.Stop()
	var err error
	readerEnded := false
loop:
	for {
		if err = r.sendPending(enc); err != nil {
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
	_ = conn.CloseWithError(0, "session closed")
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
func (r *replica) sendPending(enc *wire.Encoder) error {
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
			if err := r.sendCall(enc); err != nil {
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
		err := enc.Encode(msg)
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
func (r *replica) readLoop(dec *wire.Decoder) error {
	u := r.u
	dec.DataBuffer = r.dataBuffer
	for {
		m, err := dec.Next()
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

// flushedAt returns the greatest flush number of generation gen stamped on
// any extent in versions (0 if none): that flush has run on the replica.
func flushedAt(versions []wire.ExtentVersion, gen ids.Generation) uint64 {
	var f uint64
	for _, v := range versions {
		if v.Gen == gen {
			f = max(f, v.Flush)
		}
	}
	return f
}
