package upstairs

import (
	"context"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"tern/internal/testwait"
	"tern/internal/tlsconf/tlstest"
	"tern/volume/transport"
	"tern/volume/upstairs/engine"
	"tern/volume/wire"
)

// verdict is what a misbehaviour does with one reply on its way to the
// upstairs.
type verdict uint8

const (
	relay    verdict = iota // pass it on unchanged
	drop                    // the misbehaviour handled it (sent something else, or nothing)
	dropRest                // drop it and every later reply of the session
	hangUp                  // close the stream towards the upstairs mid-session
)

// misbehaviour sees every reply a real downstairs sends once the bad
// downstairs is armed, until it has misbehaved (s.misbehaved).
type misbehaviour func(s *badSession, m wire.Message) verdict

// badDownstairs stands in front of a real downstairs: it relays a
// session both ways (so Hello, Activate and the extent versions are
// real), and once armed lets a misbehaviour rewrite the replies. After
// the session it misbehaved in, later sessions are held at the handshake
// until heal, so the replica stays out of service (its FaultReason says
// what the misbehaviour did; LastError soon says why a reconnect failed).
type badDownstairs struct {
	t      *testing.T
	ln     *transport.Listener
	target string
	bad    misbehaviour
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	armed    atomic.Bool
	sessions atomic.Uint64 // sessions accepted; the latest may misbehave
	// acceptedCh is closed (and replaced) as each session is accepted.
	acceptedMu sync.Mutex
	acceptedCh chan struct{}
	did        atomic.Bool
	healed     chan struct{}
	heal       func()
}

// badSession is one relayed session.
type badSession struct {
	p   *badDownstairs
	up  *quic.Stream // towards the upstairs
	enc *wire.Encoder

	mu   sync.Mutex
	reqs map[wire.JobID]badRequest // requests the upstairs sent
}

type badRequest struct {
	typ    wire.MsgType
	blocks uint32
}

func newBadDownstairs(t *testing.T, target string, bad misbehaviour) *badDownstairs {
	t.Helper()
	ln, err := transport.Listen("127.0.0.1:0", tlstest.Shared(t).ServerConfig())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &badDownstairs{t: t, ln: ln, target: target, bad: bad, ctx: ctx, cancel: cancel, healed: make(chan struct{}), acceptedCh: make(chan struct{})}
	p.heal = sync.OnceFunc(func() { close(p.healed) })
	p.wg.Go(p.accept)
	t.Cleanup(p.close)
	return p
}

func (p *badDownstairs) addr() string { return p.ln.Addr().String() }

// waitSessions waits until the bad downstairs accepted n sessions in all.
func (p *badDownstairs) waitSessions(t *testing.T, n uint64) {
	t.Helper()
	deadline := time.NewTimer(testTimeout)
	defer deadline.Stop()
	for {
		p.acceptedMu.Lock()
		ch := p.acceptedCh
		p.acceptedMu.Unlock()
		if p.sessions.Load() >= n {
			return
		}
		select {
		case <-ch:
		case <-deadline.C:
			t.Fatalf("timed out waiting for session %d of the bad downstairs (%d so far)", n, p.sessions.Load())
		}
	}
}

// arm lets the misbehaviour act on the replies that follow.
func (p *badDownstairs) arm() { p.armed.Store(true) }

func (p *badDownstairs) close() {
	p.cancel()
	p.ln.Close()
	p.wg.Wait()
}

func (p *badDownstairs) accept() {
	for {
		conn, err := p.ln.Accept(p.ctx)
		if err != nil {
			return
		}
		p.wg.Go(func() { p.serve(conn) })
	}
}

func (p *badDownstairs) serve(conn *quic.Conn) {
	defer conn.CloseWithError(0, "bad downstairs done")
	seq := p.sessions.Add(1)
	p.acceptedMu.Lock()
	close(p.acceptedCh)
	p.acceptedCh = make(chan struct{})
	p.acceptedMu.Unlock()
	if p.did.Load() {
		select {
		case <-p.healed:
		case <-p.ctx.Done():
			return
		case <-conn.Context().Done():
			return
		}
	}
	up, err := conn.AcceptStream(p.ctx)
	if err != nil {
		return
	}
	dconn, err := transport.Dial(p.ctx, p.target, tlstest.Shared(p.t).ClientConfig(""))
	if err != nil {
		return
	}
	defer dconn.CloseWithError(0, "bad downstairs done")
	down, err := dconn.OpenStreamSync(p.ctx)
	if err != nil {
		return
	}
	stop := context.AfterFunc(p.ctx, func() {
		conn.CloseWithError(0, "bad downstairs closing")
		dconn.CloseWithError(0, "bad downstairs closing")
	})
	defer stop()
	s := &badSession{p: p, up: up, enc: wire.NewEncoder(up), reqs: make(map[wire.JobID]badRequest)}
	var relays sync.WaitGroup
	relays.Go(func() {
		defer dconn.CloseWithError(0, "upstairs gone")
		dec, enc := wire.NewDecoder(up), wire.NewEncoder(down)
		for {
			m, err := dec.Next()
			if err != nil {
				return
			}
			s.record(m)
			if enc.Encode(m) != nil {
				return
			}
		}
	})
	relays.Go(func() {
		defer conn.CloseWithError(0, "downstairs gone")
		dec := wire.NewDecoder(down)
		dropping := false
		for {
			m, err := dec.Next()
			if err != nil {
				return
			}
			v := relay
			switch {
			case dropping:
				v = drop
			case p.armed.Load() && !p.did.Load() && p.sessions.Load() == seq:
				// Only the latest session misbehaves: an older one is
				// one the upstairs gave up on (a reply it found too
				// slow) and reads no more, so a misbehaviour there would
				// go unseen while the latest serves on honestly.
				v = p.bad(s, m)
			}
			switch v {
			case relay:
				if s.enc.Encode(m) != nil {
					return
				}
			case dropRest:
				dropping = true
			case hangUp:
				up.Close()
				dropping = true
			}
		}
	})
	relays.Wait()
}

func (s *badSession) record(m wire.Message) {
	var r badRequest
	var id wire.JobID
	switch m := m.(type) {
	case *wire.Write:
		id, r = m.JobID, badRequest{wire.TypeWrite, uint32(len(m.Hashes))}
	case *wire.Read:
		id, r = m.JobID, badRequest{wire.TypeRead, m.Count}
	case *wire.Flush:
		id, r = m.JobID, badRequest{typ: wire.TypeFlush}
	default:
		return
	}
	s.mu.Lock()
	s.reqs[id] = r
	s.mu.Unlock()
}

// request returns what the upstairs asked with job id.
func (s *badSession) request(id wire.JobID) badRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reqs[id]
}

// misbehaved records that the misbehaviour happened: later sessions wait
// for heal.
func (s *badSession) misbehaved() { s.p.did.Store(true) }

// raw writes bytes to the upstairs outside any frame.
func (s *badSession) raw(b []byte) { _, _ = s.up.Write(b) }

// onAckOf runs f on the first Ack answering a request of type t.
func onAckOf(t wire.MsgType, f func(s *badSession, m *wire.Ack) verdict) misbehaviour {
	return func(s *badSession, m wire.Message) verdict {
		if a, ok := m.(*wire.Ack); ok && s.request(a.JobID).typ == t {
			s.misbehaved()
			return f(s, a)
		}
		return relay
	}
}

// onReadResponse runs f on the first ReadResponse.
func onReadResponse(f func(s *badSession, m *wire.ReadResponse) verdict) misbehaviour {
	return func(s *badSession, m wire.Message) verdict {
		if r, ok := m.(*wire.ReadResponse); ok {
			s.misbehaved()
			return f(s, r)
		}
		return relay
	}
}

// header is a frame header.
func header(t wire.MsgType, n uint32) []byte {
	h := make([]byte, wire.HeaderSize)
	binary.LittleEndian.PutUint16(h[0:], wire.FrameMagic)
	binary.LittleEndian.PutUint16(h[2:], uint16(t))
	binary.LittleEndian.PutUint32(h[4:], n)
	return h
}

// badTestReplica is where the bad downstairs sits: replica 0 wins ties
// between idle replicas, so it serves reads.
const badTestReplica = 0

// misbehaviours are the attacks of TestMisbehavingDownstairs: each breaks
// the protocol once, after activation, while guest IO runs.
var misbehaviours = []struct {
	name string
	bad  misbehaviour
	// reason is what the replica's FaultReason must say; empty when the
	// misbehaviour is not the replica's fault to the upstairs (corrupt
	// data is repaired in place and the replica stays Active).
	reason string
}{
	{"reply to unknown job", onAckOf(wire.TypeWrite, func(s *badSession, m *wire.Ack) verdict {
		_ = s.enc.Encode(m)
		_ = s.enc.Encode(&wire.Ack{JobID: m.JobID + 1<<40})
		return drop
	}), "not sent or already answered"},
	{"reply twice", onAckOf(wire.TypeWrite, func(s *badSession, m *wire.Ack) verdict {
		_ = s.enc.Encode(m)
		_ = s.enc.Encode(m)
		return drop
	}), "not sent or already answered"},
	{"read data shorter than asked", onReadResponse(func(s *badSession, m *wire.ReadResponse) verdict {
		_ = s.enc.Encode(&wire.ReadResponse{JobID: m.JobID, Hashes: m.Hashes[1:], Data: m.Data[testBlockSize:]})
		return drop
	}), "bytes for a read of"},
	{"read hashes do not count the data", onReadResponse(func(s *badSession, m *wire.ReadResponse) verdict {
		_ = s.enc.Encode(&wire.ReadResponse{JobID: m.JobID, Hashes: append(m.Hashes, 7), Data: m.Data})
		return drop
	}), "hashes for"},
	{"read data does not match its hashes", onReadResponse(func(s *badSession, m *wire.ReadResponse) verdict {
		m.Data[len(m.Data)-1] ^= 0xff
		_ = s.enc.Encode(m)
		return drop
	}), ""},
	{"ack to a read", onReadResponse(func(s *badSession, m *wire.ReadResponse) verdict {
		_ = s.enc.Encode(&wire.Ack{JobID: m.JobID})
		return drop
	}), "answered Read with Ack"},
	{"read response to a write", onAckOf(wire.TypeWrite, func(s *badSession, m *wire.Ack) verdict {
		n := s.request(m.JobID).blocks
		data := make([]byte, int(n)*testBlockSize)
		hashes := make([]uint64, n)
		hashBlocks(hashes, data, testBlockSize)
		_ = s.enc.Encode(&wire.ReadResponse{JobID: m.JobID, Hashes: hashes, Data: data})
		return drop
	}), "answered Write with ReadResponse"},
	{"unsolicited extent versions", onAckOf(wire.TypeWrite, func(s *badSession, m *wire.Ack) verdict {
		_ = s.enc.Encode(m)
		_ = s.enc.Encode(&wire.ExtentVersions{JobID: 0, Versions: make([]wire.ExtentVersion, 3)})
		return drop
	}), "unsolicited ExtentVersions"},
	{"unsolicited repair data", onAckOf(wire.TypeWrite, func(s *badSession, m *wire.Ack) verdict {
		_ = s.enc.Encode(m)
		data := make([]byte, testBlockSize)
		// An ID far above any job's: the upstairs never asked for it.
		_ = s.enc.Encode(&wire.RepairData{JobID: m.JobID + 1<<40, Blocks: []uint32{0}, Hashes: []uint64{1}, Data: data})
		return drop
	}), "not sent or already answered"},
	{"garbage mid-stream", onAckOf(wire.TypeWrite, func(s *badSession, m *wire.Ack) verdict {
		s.raw([]byte("HTTP/1.1 500 Internal Server Error\r\n\r\n"))
		return dropRest
	}), "bad frame magic"},
	{"frame larger than the maximum", onAckOf(wire.TypeWrite, func(s *badSession, m *wire.Ack) verdict {
		s.raw(header(wire.TypeReadResponse, wire.MaxPayload+1))
		return dropRest
	}), "frame too large"},
	{"stream closed mid-frame", onAckOf(wire.TypeWrite, func(s *badSession, m *wire.Ack) verdict {
		s.raw(header(wire.TypeAck, 8))
		s.raw([]byte{1, 2, 3})
		return hangUp
	}), "unexpected EOF"},
	{"stall forever", onAckOf(wire.TypeWrite, func(s *badSession, m *wire.Ack) verdict {
		return dropRest
	}), "unanswered for"},
	{"stall on a read", onReadResponse(func(s *badSession, m *wire.ReadResponse) verdict {
		return dropRest // the read waits for the timeout, then moves to a peer
	}), "unanswered for"},
}

// TestMisbehavingDownstairs runs each misbehaviour against a real
// upstairs with two honest replicas: IO goes on (writes acknowledged by
// two, reads verified), the bad replica ends Offline or Faulted with a
// FaultReason that says what it did (kept while its reconnects fail),
// it comes back once it behaves, and no goroutine outlives Close.
func TestMisbehavingDownstairs(t *testing.T) {
	for _, tc := range misbehaviours {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t)
			p := newBadDownstairs(t, c.ds[badTestReplica].addr, tc.bad)
			cfg := c.config()
			cfg.Targets[badTestReplica] = p.addr()
			if tc.reason == "unanswered for" {
				// Short enough for the stalls to be noticed soon, long
				// enough for honest replicas on a loaded machine. The
				// other cases keep the default: an honest replica dropped
				// for a slow reply just before it misbehaves would be
				// dropped for the wrong reason.
				cfg.ReplyTimeout = 2 * time.Second
			}
			u := c.open(cfg, 1)
			m := &model{data: make([]byte, volumeBytes())}
			rng := rand.New(rand.NewPCG(1, 2))
			workload(t, u, m, rng, 8)
			p.arm()
			misbehave(t, u, p, m, rng, 24)
			if tc.reason == "" {
				// Not faulted: a slow honest replica may be dropped and
				// come back (Offline), but corrupt data is no fault.
				if st := u.Status().Replicas[badTestReplica]; st.State == engine.ReplicaFaulted {
					t.Fatalf("replica %d is faulted (%s), want it kept", badTestReplica, st.FaultReason)
				}
			} else {
				// The misbehaviour ran; the replica is dropped for it and
				// stays out (its reconnects are held), so the state it is
				// dropped to is still there when the wait looks.
				st := waitReplica(t, u, badTestReplica, "the bad replica to be dropped", func(st ReplicaStatus) bool {
					return st.State == engine.ReplicaOffline || st.State == engine.ReplicaFaulted
				})
				// The reason was set with the state change and stays while
				// the reconnects fail.
				if !strings.Contains(st.FaultReason, tc.reason) || st.FaultedAt.IsZero() {
					t.Fatalf("bad replica %v with fault reason %q (at %v), want one saying %q",
						st.State, st.FaultReason, st.FaultedAt, tc.reason)
				}
				t.Logf("bad replica: %+v", st)
				workload(t, u, m, rng, 16) // two replicas carry on
			}
			p.heal()
			waitReplica(t, u, badTestReplica, "the healed replica to come back", stateIs(engine.ReplicaActive))
			workload(t, u, m, rng, 8)
			if err := u.Close(); err != nil {
				t.Fatal(err)
			}
			requireNoGoroutines(t)
			p.close()
			c.requireSameReplicas(m.data)
		})
	}
}

// misbehave runs at least n steps of the workload against the armed bad
// downstairs p, and as many more as it takes for the misbehaviour to run.
// Until it has, each read waits for the bad replica to be Active and owe
// nothing first, so the read is routed to it (reads go to the Active
// replica owing least, replica 0 on a tie): behind its relay the bad
// replica is the last to acknowledge every write, which returns once two
// replicas have, and a read issued straight after would go to a peer, on
// a loaded machine every time.
func misbehave(t *testing.T, u *Upstairs, p *badDownstairs, m *model, rng *rand.Rand, n int) {
	t.Helper()
	ctx := ctxT(t)
	toBad := func() {
		if p.did.Load() {
			return
		}
		waitStatus(t, u, "the bad replica to owe nothing", func(s Status) bool {
			st := s.Replicas[badTestReplica]
			return p.did.Load() || st.State == engine.ReplicaActive && st.OutstandingJobs == 0
		})
	}
	for i := 0; i < n || !p.did.Load(); i++ {
		select {
		case <-ctx.Done():
			t.Fatalf("the misbehaviour never ran in %d steps of IO", i)
		default:
		}
		step(t, ctx, u, m, rng, i, toBad)
	}
}

// waitReplica waits, on Upstairs.ReplicaStateChanged, until the status of
// replica r satisfies cond, and returns that status.
func waitReplica(t *testing.T, u *Upstairs, r int, what string, cond func(ReplicaStatus) bool) ReplicaStatus {
	t.Helper()
	var st ReplicaStatus
	if !testwait.On(testTimeout, u.ReplicaStateChanged, func() bool { st = u.Status().Replicas[r]; return cond(st) }) {
		t.Fatalf("timed out waiting for %s: replica %d is %+v", what, r, st)
	}
	return st
}

func stateIs(s engine.ReplicaState) func(ReplicaStatus) bool {
	return func(st ReplicaStatus) bool { return st.State == s }
}

// workload writes, reads back and flushes n times at random places,
// checking every read against the model.
func workload(t *testing.T, u *Upstairs, m *model, rng *rand.Rand, n int) {
	t.Helper()
	ctx := ctxT(t)
	for i := range n {
		step(t, ctx, u, m, rng, i, func() {})
	}
}

// step is step i of a workload: a write at a random place, a read back
// (after beforeRead) checked against the model, and every fourth step a
// flush.
func step(t *testing.T, ctx context.Context, u *Upstairs, m *model, rng *rand.Rand, i int, beforeRead func()) {
	t.Helper()
	blocks := 1 + rng.IntN(16)
	off := int64(rng.IntN(testExtentBlocks*testExtentCount-blocks)) * testBlockSize
	p := make([]byte, blocks*testBlockSize)
	for j := range p {
		p[j] = byte(rng.Uint32())
	}
	if _, err := u.WriteAt(ctx, p, off); err != nil {
		t.Fatalf("write %d: %v", i, err)
	}
	m.write(p, off)
	beforeRead()
	got := make([]byte, len(p))
	if _, err := u.ReadAt(ctx, got, off); err != nil {
		t.Fatalf("read %d: %v", i, err)
	}
	m.check(t, got, off)
	if i%4 == 3 {
		if err := u.Flush(ctx); err != nil {
			t.Fatalf("flush %d: %v", i, err)
		}
	}
}

// requireNoGoroutines waits until no goroutine of the upstairs or of its
// dials is left.
func requireNoGoroutines(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(testTimeout)
	for g := ownGoroutines(); len(g) > 0; g = ownGoroutines() {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines survived Close:\n%s", len(g), strings.Join(g, "\n\n"))
		}
		runtime.Gosched()
	}
}

// TestAbsurdGeometryIsRefused: a downstairs claiming 2^32-1 extents of
// huge blocks, at activation or on a reconnect, is refused by name
// before anything is allocated per extent, and IO goes on without it.
func TestAbsurdGeometryIsRefused(t *testing.T) {
	absurd := func(s *badSession, m wire.Message) verdict {
		if hr, ok := m.(*wire.HelloReply); ok {
			s.misbehaved()
			hr.Region.ExtentCount = math.MaxUint32
			hr.Region.ExtentBlocks = math.MaxUint32
			_ = s.enc.Encode(hr)
			return drop
		}
		return relay
	}
	t.Run("at activation", func(t *testing.T) {
		c := newCluster(t)
		p := newBadDownstairs(t, c.ds[badTestReplica].addr, absurd)
		p.arm()
		cfg := c.config()
		cfg.Targets[badTestReplica] = p.addr()
		cfg.ActivationQuorumWait = 200 * time.Millisecond
		u := c.open(cfg, 1)
		waitReplica(t, u, badTestReplica, "the bad replica to be faulted", func(st ReplicaStatus) bool {
			return st.State == engine.ReplicaFaulted && strings.Contains(st.FaultReason, "invalid region")
		})
		m := &model{data: make([]byte, volumeBytes())}
		workload(t, u, m, rand.New(rand.NewPCG(3, 4)), 8)
		p.heal()
		waitReplica(t, u, badTestReplica, "the healed replica to be repaired", stateIs(engine.ReplicaActive))
		if err := u.Close(); err != nil {
			t.Fatal(err)
		}
		requireNoGoroutines(t)
		p.close()
		c.requireSameReplicas(m.data)
	})
	t.Run("on reconnect", func(t *testing.T) {
		c := newCluster(t)
		killed := atomic.Bool{}
		p := newBadDownstairs(t, c.ds[badTestReplica].addr, func(s *badSession, m wire.Message) verdict {
			if _, ok := m.(*wire.Ack); ok && killed.CompareAndSwap(false, true) {
				return hangUp // the upstairs reconnects...
			}
			return absurd(s, m) // ...and is told an absurd geometry
		})
		cfg := c.config()
		cfg.Targets[badTestReplica] = p.addr()
		u := c.open(cfg, 1)
		m := &model{data: make([]byte, volumeBytes())}
		rng := rand.New(rand.NewPCG(5, 6))
		p.arm()
		workload(t, u, m, rng, 8)
		waitReplica(t, u, badTestReplica, "the bad replica to be faulted", func(st ReplicaStatus) bool {
			return st.State == engine.ReplicaFaulted && strings.Contains(st.FaultReason, "invalid region")
		})
		workload(t, u, m, rng, 8)
		if err := u.Close(); err != nil {
			t.Fatal(err)
		}
		requireNoGoroutines(t)
	})
}

// TestFaultReasonOutlivesFailedReconnects: once a replica is dropped for
// breaking the protocol, each failed reconnect changes LastError, but
// FaultReason keeps saying what got it dropped until it is Active again.
func TestFaultReasonOutlivesFailedReconnects(t *testing.T) {
	c := newCluster(t)
	garbage := onAckOf(wire.TypeWrite, func(s *badSession, m *wire.Ack) verdict {
		s.raw([]byte("not a frame at all"))
		return dropRest
	})
	p := newBadDownstairs(t, c.ds[badTestReplica].addr, garbage)
	cfg := c.config()
	cfg.Targets[badTestReplica] = p.addr()
	// The held reconnects fail at the hello reply after this: not so short
	// that an honest reply on a loaded machine outlasts it, which would
	// drop the replica for that before the garbage.
	cfg.ReplyTimeout = 3 * time.Second
	u := c.open(cfg, 1)
	m := &model{data: make([]byte, volumeBytes())}
	rng := rand.New(rand.NewPCG(7, 8))
	p.arm()
	workload(t, u, m, rng, 8)
	// The session that sent garbage was the latest; the next is held
	// until heal, and fails at the hello. The upstairs records that
	// failure before it dials again, so once the session after it is
	// accepted, LastError says why the held one failed.
	waitReplica(t, u, badTestReplica, "the bad replica to be dropped", func(st ReplicaStatus) bool {
		return st.State == engine.ReplicaOffline || st.State == engine.ReplicaFaulted
	})
	p.waitSessions(t, p.sessions.Load()+2)
	st := u.Status().Replicas[badTestReplica]
	if st.State != engine.ReplicaOffline || !strings.Contains(st.LastError, "hello") {
		t.Fatalf("bad replica %v with last error %q after a held reconnect; want it out of service, failing at the hello", st.State, st.LastError)
	}
	if !strings.Contains(st.FaultReason, "bad frame magic") || st.FaultedAt.IsZero() {
		t.Fatalf("fault reason %q (at %v) after a failed reconnect (%q): want the bad frame",
			st.FaultReason, st.FaultedAt, st.LastError)
	}
	t.Logf("dropped replica: fault reason %q, last error %q", st.FaultReason, st.LastError)
	p.heal()
	waitReplica(t, u, badTestReplica, "the healed replica to come back", stateIs(engine.ReplicaActive))
	if st := u.Status().Replicas[badTestReplica]; st.FaultReason != "" || !st.FaultedAt.IsZero() {
		t.Fatalf("active replica keeps fault reason %q (at %v)", st.FaultReason, st.FaultedAt)
	}
	workload(t, u, m, rng, 4)
	if err := u.Close(); err != nil {
		t.Fatal(err)
	}
	requireNoGoroutines(t)
	p.close()
	c.requireSameReplicas(m.data)
}
