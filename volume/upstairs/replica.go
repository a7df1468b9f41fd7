package upstairs

import (
	"context"
	"errors"
	"fmt"
	"time"

	"tern/volume/dsclient"
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
	// Each reply of the setup is bounded by ReplyTimeout, so a downstairs
	// that stalls during Hello, Activate or the extent versions ends its
	// session instead of holding it (and Activate) forever.
	c, err := dsclient.Dial(ctx, r.target, u.cfg.TLS, dsclient.Options{
		Dial:         transport.DialOptions{KeepAlivePeriod: u.cfg.KeepAlivePeriod, IdleTimeout: u.cfg.IdleTimeout},
		ReplyTimeout: u.cfg.ReplyTimeout,
	})
	if err != nil {
		if stepError(err) != nil { // the session stream
			return r.setupError(err)
		}
		return fmt.Errorf("connecting replica %d: %w", r.id, err)
	}
	defer c.Close("session closed")
	// Closing the connection is how a blocked read or write is interrupted.
	stopClose := context.AfterFunc(ctx, func() { c.Close("upstairs closing") })
	defer stopClose()
	if err := r.negotiate(ctx, c); err != nil {
		return err
	}
	// From here on the reply timeout is the serve loop's.
	if err := c.SetReadDeadline(time.Time{}); err != nil {
		return fmt.Errorf("replica %d: %w", r.id, err)
	}
	return r.serve(c)
}
