package sim

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/google/uuid"

	"tern/volume/ec"
	"tern/volume/extent"
	"tern/volume/ids"
	"tern/volume/wire"
)

// ECConfig is one run of the erasure-coded simulation (RunEC).
type ECConfig struct {
	Seed   uint64
	Layout ec.Layout
	// Steps is the length of the faulty phase in ticks (ECTick of virtual
	// time each); the workload runs and faults strike only then.
	Steps int
	// Faults are the chances of each fault kind: per datagram for the
	// packet faults, per tick for the others.
	Faults Probabilities
	// Workers is how many callers submit IO at once.
	Workers int
	// ServerTLS and ClientTLS are the downstairs' and the volume's mutual
	// TLS configurations.
	ServerTLS, ClientTLS *tls.Config
	// Logf, when set, receives the run's trace lines as they happen.
	Logf func(format string, args ...any)
	// DumpStacks puts every goroutine's stack into the trace when the
	// volume does not converge.
	DumpStacks bool
}

// ECTick is the erasure-coded world's tick of virtual time.
const ECTick = 5 * time.Millisecond

// DefaultECConfig is seed's configuration for CI and campaigns: the
// layout cycles through 4+2, 2+1 and 3+3 with the seed.
func DefaultECConfig(seed uint64, serverTLS, clientTLS *tls.Config) ECConfig {
	layouts := []ec.Layout{ec.DefaultLayout, {Data: 2, Parity: 1}, {Data: 3, Parity: 3}}
	faults := DefaultProbabilities()
	// Power cuts five times as often as the replicated campaign's: the
	// k+1 acknowledgement is tested only by a cut while another shard is
	// away, and at the replicated chance 40 seeds did not catch it
	// weakened to k (docs/reliability.md).
	faults[faultCrash] *= 5
	return ECConfig{
		Seed: seed, Layout: layouts[seed%uint64(len(layouts))], Steps: 2000,
		Faults: faults, Workers: 4,
		ServerTLS: serverTLS, ClientTLS: clientTLS,
	}
}

// ECResult is what an erasure-coded run did and found.
type ECResult struct {
	Seed   uint64
	Layout ec.Layout
	Faults FaultCounts
	// Violations are the invariants broken (the run goes on to its end,
	// recording at most ecMaxViolations).
	Violations []string
	// Lost counts blocks whose acknowledged, flushed data the volume no
	// longer returns at the end.
	Lost int
	// WritesAcked, FlushesAcked and ReadsChecked count the callers' IO
	// that succeeded; a run in which none did tested nothing, and fails.
	WritesAcked, FlushesAcked, ReadsChecked int
	// IOFailed counts IO that failed or timed out (allowed while faults
	// strike: a fenced upstairs, fewer than k shards reachable).
	IOFailed int
	// Latent counts shard blocks the final scrub rewrote: damage nothing
	// read or repaired before.
	Latent uint64
	// Trace is every trace line.
	Trace []string
}

// Summary is the run's summary line.
func (r ECResult) Summary() string {
	return fmt.Sprintf("ecsim: seed=%d layout=%v faults=%d writes=%d flushes=%d reads=%d failed_io=%d latent=%d lost=%d violations=%d",
		r.Seed, r.Layout, r.Faults.Total(), r.WritesAcked, r.FlushesAcked, r.ReadsChecked, r.IOFailed, r.Latent, r.Lost, len(r.Violations))
}

// ecMaxViolations bounds how many violations a run records.
const ecMaxViolations = 20

// Geometry of the erasure-coded world: 512-byte blocks, 8 per extent, 8
// extents per shard (63 stripes of data, the last block being the
// shard's metadata), so IO collides on stripes often.
const (
	ecBlockSize    = 512
	ecExtentBlocks = 8
	ecExtentCount  = 8
)

// Virtual-time bounds of the erasure-coded world.
const (
	ecIOTimeout       = 60 * time.Second
	ecConverge        = 10 * time.Minute
	ecActivateTimeout = 2 * time.Minute
)

// ecWorld is one erasure-coded run: k+m production downstairs on
// simulated disks, the production volume (and, after a takeover, a
// second one at the next generation) on a simulated network, the
// callers and their oracle.
type ecWorld struct {
	cfg    ECConfig
	net    *packetNet
	spec   extent.Spec
	shards []*ecShard
	rng    *rand.Rand // the fault injector's; only its goroutine uses it

	mu       sync.Mutex
	oracle   oracle
	vols     [upstairsMax]*ec.Volume
	cur      int
	fencedAt [upstairsMax]bool // the upstairs was taken over
	fenced   map[uint64]bool   // values written by an upstairs after it was taken over
	busy     map[uint64]bool   // blocks a write in flight covers
	inflight map[uint64]bool   // values of writes in flight
	nextJob  [upstairsMax]wire.JobID
	res      ECResult
	blocks   uint64

	// Fault model state, the injector's.
	partedUntil []time.Time // per shard, a partition from the current upstairs
	flipped     []bool      // per shard, a flipped bit no scrub has seen
	// rejoin is, per shard crashed or replaced, how many sessions the
	// current volume had attached of it then: it is impaired until a
	// later one attaches (the volume may not notice the crash for an
	// idle timeout, and until it does it counts the shard active).
	rejoin   []int64
	tookOver bool
}

// RunEC runs one seeded simulation of the erasure-coded volume. It must
// run in a synctest bubble (testing/synctest), where time is virtual and
// the run takes seconds, not the minutes it simulates.
func RunEC(cfg ECConfig) ECResult {
	w := &ecWorld{
		cfg: cfg, net: newPacketNet(cfg.Seed, cfg.Faults),
		rng:    rand.New(rand.NewPCG(cfg.Seed, 0xec51)),
		fenced: map[uint64]bool{}, busy: map[uint64]bool{}, inflight: map[uint64]bool{},
	}
	w.res.Seed, w.res.Layout = cfg.Seed, cfg.Layout
	w.spec = extent.NewSpec(ecBlockSize, ecExtentBlocks, ecExtentCount)
	w.spec.UUID = uuid.UUID{0xec, 0x51}
	if err := w.run(); err != nil {
		w.violate("%v", err)
	}
	netFaults := w.net.faultCounts()
	for k := range faultKinds {
		w.res.Faults[k] += netFaults[k]
	}
	if w.res.WritesAcked == 0 || w.res.FlushesAcked == 0 || w.res.ReadsChecked == 0 {
		w.violate("%s: %d writes, %d flushes, %d reads succeeded", noProgress, w.res.WritesAcked, w.res.FlushesAcked, w.res.ReadsChecked)
	}
	return w.res
}

func (w *ecWorld) logf(format string, args ...any) {
	line := fmt.Sprintf("%s ", time.Now().UTC().Format("15:04:05.000")) + fmt.Sprintf(format, args...)
	w.mu.Lock()
	w.res.Trace = append(w.res.Trace, line)
	w.mu.Unlock()
	if w.cfg.Logf != nil {
		w.cfg.Logf("%s", line)
	}
}

// violate records a broken invariant.
func (w *ecWorld) violate(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	w.logf("VIOLATION %s", msg)
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.res.Violations) < ecMaxViolations {
		w.res.Violations = append(w.res.Violations, msg)
	}
}

func (w *ecWorld) run() error {
	l := w.cfg.Layout
	for i := range l.Shards() {
		host := fmt.Sprintf("10.0.1.%d", i+1)
		s := &ecShard{id: i, host: host, addr: net.JoinHostPort(host, "3810"), net: w.net, tls: w.cfg.ServerTLS, spec: w.spec}
		if err := s.create(); err != nil {
			return err
		}
		if err := s.start(); err != nil {
			return err
		}
		w.shards = append(w.shards, s)
	}
	w.partedUntil = make([]time.Time, l.Shards())
	w.flipped = make([]bool, l.Shards())
	w.rejoin = make([]int64, l.Shards())
	for i := range w.rejoin {
		w.rejoin[i] = -1
	}
	defer w.haltAll()
	defer w.closeVolumes()

	v, err := w.openVolume(0, 1)
	if err != nil {
		return err
	}
	w.vols[0] = v
	w.blocks = v.SizeBytes() / ecBlockSize
	w.oracle.init(w.blocks)

	stop := make(chan struct{})
	var workers sync.WaitGroup
	for n := range w.cfg.Workers {
		r := rand.New(rand.NewPCG(w.cfg.Seed, uint64(n)))
		workers.Go(func() { w.worker(r, stop) })
	}
	for step := 0; step < w.cfg.Steps; step++ {
		time.Sleep(ECTick)
		w.injectFaults()
	}
	close(stop)
	workers.Wait()
	w.logf("faults stop")
	return w.heal()
}

// openVolume makes upstairs u's volume and activates it at gen.
func (w *ecWorld) openVolume(u int, gen ids.Generation) (*ec.Volume, error) {
	targets := make([]string, len(w.shards))
	for i, s := range w.shards {
		targets[i] = s.addr
	}
	v, err := ec.New(ec.Config{
		Layout: w.cfg.Layout, Targets: targets, TLS: w.cfg.ClientTLS,
		Network:              hostNet{w.net, fmt.Sprintf("10.0.0.%d", u+1)},
		ActivationQuorumWait: time.Second,
		ReconnectMin:         20 * time.Millisecond, ReconnectMax: 500 * time.Millisecond,
		ReplyTimeout: 5 * time.Second, IdleTimeout: 2 * time.Second, KeepAlivePeriod: 500 * time.Millisecond,
		Logger: slog.New(traceHandler{w: w, attrs: fmt.Sprintf(" u%d", u)}),
	})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), ecActivateTimeout)
	defer cancel()
	if err := v.Activate(ctx, gen); err != nil {
		v.Close()
		return nil, fmt.Errorf("upstairs %d: activation at generation %d: %w", u, gen, err)
	}
	w.logf("u%d active at generation %d", u, gen)
	return v, nil
}

// current returns the volume the callers use and its upstairs.
func (w *ecWorld) current() (int, *ec.Volume) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.cur, w.vols[w.cur]
}

// worker is one caller: writes (full and partial stripes), reads and
// flushes at random, each judged by the oracle.
func (w *ecWorld) worker(r *rand.Rand, stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		case <-time.After(time.Duration(r.Int64N(int64(4 * ECTick)))):
		}
		u, v := w.current()
		n := 1 + r.Uint64N(2*uint64(w.cfg.Layout.Data))
		first := r.Uint64N(w.blocks - n + 1)
		switch p := r.IntN(10); {
		case p < 5:
			w.write(u, v, first, n)
		case p < 9:
			w.read(u, v, first, n)
		default:
			w.flush(u, v)
		}
	}
}

// write writes blocks [first, first+n) with a new value, unless a write
// in flight covers any of them: concurrent writes of one block would
// leave the oracle unable to order them (the volume orders them by
// arrival, not by when the caller chose its value). Writes of different
// blocks of one stripe do run at once.
func (w *ecWorld) write(u int, v *ec.Volume, first, n uint64) {
	w.mu.Lock()
	for b := first; b < first+n; b++ {
		if w.busy[b] {
			w.mu.Unlock()
			return
		}
	}
	for b := first; b < first+n; b++ {
		w.busy[b] = true
	}
	w.nextJob[u]++
	id := w.nextJob[u]
	val := w.oracle.nextValue()
	w.oracle.submitWrite(u, id, val, first, uint32(n))
	w.inflight[val] = true
	late := w.fencedAt[u]
	if late {
		w.fenced[val] = true
	}
	w.mu.Unlock()

	p := make([]byte, n*ecBlockSize)
	for i := range n {
		fillBlock(p[i*ecBlockSize:(i+1)*ecBlockSize], val, first+i)
	}
	ctx, cancel := context.WithTimeout(context.Background(), ecIOTimeout)
	_, err := v.WriteAt(ctx, p, int64(first*ecBlockSize))
	cancel()

	w.mu.Lock()
	for b := first; b < first+n; b++ {
		delete(w.busy, b)
	}
	delete(w.inflight, val)
	w.oracle.writeDone(u, id, err == nil)
	if err != nil {
		w.res.IOFailed++
	} else {
		w.res.WritesAcked++
	}
	w.mu.Unlock()
	if err == nil && late {
		w.violate("u%d, taken over, acknowledged write %d of blocks %d..%d", u, val, first, first+n-1)
	}
}

// read reads blocks [first, first+n) and judges each block.
func (w *ecWorld) read(u int, v *ec.Volume, first, n uint64) {
	w.mu.Lock()
	w.nextJob[u]++
	id := w.nextJob[u]
	w.oracle.submitRead(u, id, first, uint32(n))
	w.mu.Unlock()
	p := make([]byte, n*ecBlockSize)
	ctx, cancel := context.WithTimeout(context.Background(), ecIOTimeout)
	_, err := v.ReadAt(ctx, p, int64(first*ecBlockSize))
	cancel()
	var bad []string
	w.mu.Lock()
	if err != nil {
		w.res.IOFailed++
	} else {
		w.res.ReadsChecked++
		for i := range n {
			b := first + i
			val := decodeBlock(p[i*ecBlockSize:(i+1)*ecBlockSize], b)
			if msg := w.oracle.checkRead(u, id, b, val); msg != "" {
				bad = append(bad, fmt.Sprintf("u%d read: %s", u, msg))
			} else if w.fenced[val] {
				bad = append(bad, fmt.Sprintf("u%d read block %d: value %d, written by an upstairs after it was taken over", u, b, val))
			}
		}
	}
	w.oracle.readDone(u, id)
	w.mu.Unlock()
	for _, m := range bad {
		w.violate("%s", m)
	}
}

// flush flushes; it covers the writes acknowledged before it was sent,
// that is, every value below the oldest write still in flight.
func (w *ecWorld) flush(u int, v *ec.Volume) bool {
	w.mu.Lock()
	w.nextJob[u]++
	id := w.nextJob[u]
	mark := w.oracle.next - 1
	for val := range w.inflight {
		mark = min(mark, val-1)
	}
	w.oracle.flushes[jobKey{u, id}] = mark
	w.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), ecIOTimeout)
	err := v.Flush(ctx)
	cancel()
	w.mu.Lock()
	defer w.mu.Unlock()
	w.oracle.flushDone(u, id, err == nil)
	if err != nil {
		w.res.IOFailed++
		return false
	}
	w.res.FlushesAcked++
	return true
}

// impaired reports whether shard i is out of full service: down,
// partitioned, holding a flip no scrub has seen, or not active and
// current in the volume's own view.
func (w *ecWorld) impaired(i int, st ec.Status) bool {
	if !w.shards[i].up() || time.Now().Before(w.partedUntil[i]) || w.flipped[i] {
		return true
	}
	s := st.Shards[i]
	if w.rejoin[i] >= 0 && int64(s.Sessions) <= w.rejoin[i] {
		return true
	}
	return s.State != ec.ShardActive || s.StripesBehind > 0
}

// impairedCount counts the impaired shards other than i.
func (w *ecWorld) impairedCount(except int, st ec.Status) int {
	n := 0
	for j := range w.shards {
		if j != except && w.impaired(j, st) {
			n++
		}
	}
	return n
}

// chance draws whether a fault of kind strikes this tick.
func (w *ecWorld) chance(kind faultKind) bool {
	if w.rng.Float64() >= w.cfg.Faults[kind] {
		return false
	}
	w.res.Faults[kind]++
	return true
}

// injectFaults is one tick of the fault injector. The fault model is
// what the volume promises to survive: at most m shards impaired at once
// (down, cut off, replaced, or holding an unscrubbed flip); a power cut
// of one shard only while every other is whole (an acknowledged write is
// on k+1 shards, so one loss of unflushed data is survivable, not two);
// a takeover only while every shard is whole; a whole-volume crash only
// then too, with one shard losing power and the others their processes.
func (w *ecWorld) injectFaults() {
	_, v := w.current()
	st := v.Status()
	m := w.cfg.Layout.Parity
	i := w.rng.IntN(len(w.shards))
	s := w.shards[i]
	now := time.Now()

	// Shards stopped come back after a while.
	for _, d := range w.shards {
		if !d.up() && w.rng.IntN(40) == 0 {
			w.logf("d%d restarts", d.id)
			if err := d.start(); err != nil {
				w.violate("%v", err)
			}
		}
	}
	// A shard holding a flip is scrubbed after a while (a periodic
	// scrubber), which clears the flip from the budget.
	if w.anyFlipped() && w.rng.IntN(100) == 0 {
		w.scrub(v)
	}
	healthyElse := w.impairedCount(i, st) == 0
	budget := w.impairedCount(i, st) < m && !w.impaired(i, st)

	if budget && w.chance(faultDisconnect) {
		until := now.Add(time.Duration(w.rng.Int64N(int64(300 * 2 * ECTick))))
		w.logf("fault: disconnect u%d d%d until +%v", w.cur, i, until.Sub(now))
		w.partedUntil[i] = until
		w.net.partition(fmt.Sprintf("10.0.0.%d", w.cur+1), s.host, until)
		return
	}
	if budget && !w.lossElsewhere(i, st) && w.chance(faultCrash) {
		w.logf("fault: crash d%d (power lost)", i)
		w.rejoin[i] = int64(st.Shards[i].Sessions)
		s.crash(w.rng.IntN, true)
		return
	}
	if budget && w.chance(faultBitFlip) {
		w.flipBit(i)
		return
	}
	if budget && w.chance(faultReplace) {
		w.logf("fault: replace d%d by an empty region", i)
		w.rejoin[i] = int64(st.Shards[i].Sessions)
		s.crash(w.rng.IntN, false)
		if err := s.create(); err != nil {
			w.violate("%v", err)
		}
		return
	}
	if healthyElse && !w.impaired(i, st) && !w.tookOver && w.chance(faultTakeover) {
		w.takeover()
		return
	}
	if healthyElse && !w.impaired(i, st) && w.chance(faultCrashAll) {
		w.logf("fault: every shard crashes, d%d losing power", i)
		for j, d := range w.shards {
			w.rejoin[j] = int64(st.Shards[j].Sessions)
			d.crash(w.rng.IntN, d == s)
		}
		w.mu.Lock()
		w.oracle.crashAll()
		w.mu.Unlock()
	}
}

// lossElsewhere reports whether a shard other than i may be missing
// data it acknowledged: down, crashed or replaced and not yet rejoined
// and repaired, or holding an unscrubbed flip. A power cut of i then
// would be a second loss of unflushed data, beyond what the k+1
// acknowledgement promises; with only shards cut off elsewhere it is
// within it (a write acknowledged while they were away is on k+1 others).
func (w *ecWorld) lossElsewhere(i int, st ec.Status) bool {
	for j, s := range w.shards {
		if j == i {
			continue
		}
		sh := st.Shards[j]
		if !s.up() || w.flipped[j] || w.rejoin[j] >= 0 && (int64(sh.Sessions) <= w.rejoin[j] || sh.StripesBehind > 0) {
			return true
		}
	}
	return false
}

func (w *ecWorld) anyFlipped() bool {
	for _, f := range w.flipped {
		if f {
			return true
		}
	}
	return false
}

// flipBit flips a bit of a random block of shard i's data at rest.
func (w *ecWorld) flipBit(i int) {
	s := w.shards[i]
	dataBlocks := uint64(w.spec.Blocks()) - 1 // the last is the metadata
	b := w.rng.Uint64N(dataBlocks)
	name := fmt.Sprintf("%06d.ext", b/ecExtentBlocks)
	off := int64(b%ecExtentBlocks)*ecBlockSize + int64(w.rng.IntN(ecBlockSize))
	if s.disk.flipBit(name, off, uint(w.rng.IntN(8))) {
		w.logf("fault: bit flip d%d block %d", i, b)
		w.flipped[i] = true
	}
}

// scrub runs the volume's scrub; the flips it finds are repaired.
func (w *ecWorld) scrub(v *ec.Volume) {
	ctx, cancel := context.WithTimeout(context.Background(), ecIOTimeout)
	rep, err := v.Scrub(ctx)
	cancel()
	if err != nil {
		w.logf("scrub: %v", err)
		return
	}
	w.logf("scrub: %d stripes, %d blocks rewritten", rep.StripesChecked, rep.BlocksRewritten)
	clear(w.flipped)
}

// takeover activates a second upstairs at the next generation while the
// callers keep writing through the first; once it is active they move
// to it, and the first must get nothing more acknowledged or applied.
func (w *ecWorld) takeover() {
	w.tookOver = true
	w.logf("fault: takeover by u1 at generation 2")
	v, err := w.openVolume(1, 2)
	if err != nil {
		w.violate("takeover: %v", err)
		return
	}
	w.mu.Lock()
	w.vols[1] = v
	w.fencedAt[0] = true
	w.cur = 1
	w.oracle.takeover(1)
	w.mu.Unlock()
	// Partitions cut the old upstairs, not the new one, and the new one
	// counts its own sessions.
	clear(w.partedUntil)
	for i := range w.rejoin {
		w.rejoin[i] = -1
	}
	w.net.heal()
}

// heal ends the faults, waits for every shard to be active and current,
// then checks what the volume holds against the oracle, scrubs, and
// checks every stripe on the shards' disks.
func (w *ecWorld) heal() error {
	w.net.quiet()
	w.net.heal()
	for _, s := range w.shards {
		if !s.up() {
			if err := s.start(); err != nil {
				return err
			}
		}
	}
	_, v := w.current()
	deadline := time.After(ecConverge)
	for {
		ch := v.StateChanged()
		st := v.Status()
		whole := true
		for _, s := range st.Shards {
			whole = whole && s.State == ec.ShardActive && s.StripesBehind == 0
		}
		if whole {
			break
		}
		if st.Err != nil {
			return fmt.Errorf("after faults stopped the volume failed: %w", st.Err)
		}
		select {
		case <-ch:
		case <-time.After(time.Second):
		case <-deadline:
			if w.cfg.DumpStacks {
				buf := make([]byte, 4<<20)
				w.logf("goroutines at the deadline:\n%s", buf[:runtime.Stack(buf, true)])
			}
			return fmt.Errorf("no convergence %v after faults stopped: %+v", ecConverge, st.Shards)
		}
	}
	w.logf("every shard active and current")
	ctx, cancel := context.WithTimeout(context.Background(), ecIOTimeout)
	defer cancel()
	if !w.flush(w.cur, v) {
		return errors.New("the final flush failed")
	}
	if err := w.checkContents(ctx, v, "after repair"); err != nil {
		return err
	}
	rep, err := v.Scrub(ctx)
	if err != nil {
		return fmt.Errorf("final scrub: %w", err)
	}
	w.res.Latent = rep.BlocksRewritten
	rep, err = v.Scrub(ctx)
	if err != nil || rep.BlocksRewritten != 0 {
		return fmt.Errorf("second scrub rewrote %d blocks (%v): the first left stripes wrong", rep.BlocksRewritten, err)
	}
	if err := w.checkContents(ctx, v, "after scrub"); err != nil {
		return err
	}
	w.closeVolumes()
	w.haltAll()
	return w.checkStripes()
}

// checkContents reads the whole volume and holds every block to the
// newest acknowledged, flushed write of it (invariant 1), counting the
// blocks lost.
func (w *ecWorld) checkContents(ctx context.Context, v *ec.Volume, when string) error {
	p := make([]byte, w.blocks*ecBlockSize)
	if _, err := v.ReadAt(ctx, p, 0); err != nil {
		return fmt.Errorf("reading the whole volume %s: %w", when, err)
	}
	w.mu.Lock()
	var bad []string
	lost := 0
	for b := range w.blocks {
		val := decodeBlock(p[b*ecBlockSize:(b+1)*ecBlockSize], b)
		if msg := w.oracle.checkDurable(b, val); msg != "" {
			lost++
			if len(bad) < 5 {
				bad = append(bad, fmt.Sprintf("block %d %s", b, msg))
			}
		} else if w.fenced[val] {
			bad = append(bad, fmt.Sprintf("block %d holds value %d, written by an upstairs after it was taken over", b, val))
		}
	}
	w.res.Lost = max(w.res.Lost, lost)
	w.mu.Unlock()
	for _, m := range bad {
		w.violate("%s: %s", when, m)
	}
	return nil
}

// checkStripes reads every shard's region from its disk, with the
// downstairs stopped: every block must match its recorded hash, and
// every stripe's parity its data (invariant 4).
func (w *ecWorld) checkStripes() error {
	l := w.cfg.Layout
	codec, err := ec.NewCodec(l)
	if err != nil {
		return err
	}
	n := w.spec.Blocks()
	data := make([][]byte, l.Shards())
	for i, s := range w.shards {
		r, err := extent.OpenOn(s.disk, fmt.Sprintf("shard%d", i))
		if err != nil {
			return fmt.Errorf("reopening shard %d: %w", i, err)
		}
		p := make([]byte, n*ecBlockSize)
		hs := make([]uint64, n)
		err = r.ReadBlocks(0, p, hs)
		r.Close()
		if err != nil {
			return fmt.Errorf("reading shard %d: %w", i, err)
		}
		for b := range n - 1 {
			blk := p[b*ecBlockSize : (b+1)*ecBlockSize]
			if xxhash.Sum64(blk) != hs[b] && !(hs[b] == 0 && allZeroBlock(blk)) {
				w.violate("end: shard %d block %d fails its hash", i, b)
			}
		}
		data[i] = p
	}
	bad := 0
	for st := range n - 1 {
		stripe := make([][]byte, l.Shards())
		for i := range stripe {
			stripe[i] = bytes.Clone(data[i][st*ecBlockSize : (st+1)*ecBlockSize])
		}
		want := make([][]byte, l.Shards())
		for i := range want {
			want[i] = bytes.Clone(stripe[i])
		}
		if err := codec.Encode(want); err != nil {
			return err
		}
		for i := l.Data; i < l.Shards(); i++ {
			if !bytes.Equal(want[i], stripe[i]) {
				bad++
				if bad <= 5 {
					w.violate("end: stripe %d: parity shard %d disagrees with the data", st, i)
				}
				break
			}
		}
	}
	return nil
}

func allZeroBlock(p []byte) bool {
	for _, c := range p {
		if c != 0 {
			return false
		}
	}
	return true
}

// closeVolumes closes the volumes (a fenced one's close fails; that is
// expected).
func (w *ecWorld) closeVolumes() {
	w.mu.Lock()
	vols := w.vols
	w.vols = [upstairsMax]*ec.Volume{}
	w.mu.Unlock()
	for _, v := range vols {
		if v != nil {
			v.Close()
		}
	}
}

// traceHandler puts the volume's logs of level Info and above into the
// trace.
type traceHandler struct {
	w     *ecWorld
	attrs string
}

func (h traceHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelInfo }

func (h traceHandler) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(h.attrs)
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		return true
	})
	h.w.logf("log %s %s%s", r.Level, r.Message, b.String())
	return nil
}

func (h traceHandler) WithAttrs(as []slog.Attr) slog.Handler {
	var b strings.Builder
	b.WriteString(h.attrs)
	for _, a := range as {
		if a.Key == "upstairs_id" {
			continue
		}
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
	}
	return traceHandler{w: h.w, attrs: b.String()}
}

func (h traceHandler) WithGroup(string) slog.Handler { return h }

// haltAll stops every downstairs that runs.
func (w *ecWorld) haltAll() {
	for _, s := range w.shards {
		s.halt()
	}
}
