package sim

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"

	"github.com/cespare/xxhash/v2"
	"github.com/google/uuid"

	"tern/volume/extent"
	"tern/volume/ids"
	"tern/volume/upstairs/engine"
	"tern/volume/wire"
)

// upstairsMax is how many upstairs a run may have: the first, and the one
// that takes the region over.
const upstairsMax = 2

// Config is one simulation run.
type Config struct {
	Seed uint64
	// Steps is the length of the faulty phase, in ticks; the workload
	// submits IO and faults are injected only then.
	Steps int
	// Faults are the chances of each fault kind.
	Faults Probabilities
	// BacklogJobs and InflightJobs are the upstairs' memory bounds.
	BacklogJobs  int
	InflightJobs int
	// RetransmitTicks is how long a lost packet takes to be sent again.
	RetransmitTicks Tick
	// Skip lists fault numbers (in the order the run would inject them)
	// not to inject: how a failing run is shrunk.
	Skip map[int]bool
	// KeepTrace keeps every trace line in Result.Trace.
	KeepTrace bool
}

// DefaultConfig is the configuration of seed for campaigns and CI.
func DefaultConfig(seed uint64) Config {
	return Config{
		Seed: seed, Steps: 3000, Faults: DefaultProbabilities(),
		BacklogJobs: 48, InflightJobs: 32, RetransmitTicks: 25,
	}
}

// Result is what a run did and found.
type Result struct {
	Seed   uint64
	Events int
	Faults FaultCounts
	// Injected lists the fault numbers injected, in order.
	Injected []int
	// TraceHash is the hash of the whole event trace.
	TraceHash uint64
	// Trace is every trace line, when Config.KeepTrace.
	Trace []string
	// Violations are the invariants broken (a run stops at the first).
	Violations []string
	// Lost counts blocks whose acknowledged, flushed data was lost: every
	// such block, in the final comparison, or, when a violation stopped
	// the run first, among what the replicas hold then (a block none of
	// them holds).
	Lost int
	// WritesAcked and FlushesAcked count the callers' writes and flushes
	// that succeeded: a run in which none did tested nothing, and fails.
	WritesAcked, FlushesAcked int
	// Latent counts bit flips never read, left for a scrub to find.
	Latent int
	// LostEverywhere counts blocks torn on every replica by one crash of
	// the whole volume (faultCrashAll), zeroed by the restart
	// reconciliation.
	LostEverywhere int
}

// Summary is the run's summary line.
func (r Result) Summary() string {
	return fmt.Sprintf("sim: seed=%d events=%d faults=%d trace=%016x violations=%d",
		r.Seed, r.Events, r.Faults.Total(), r.TraceHash, len(r.Violations))
}

// world is one run: the scheduler, one or two upstairs, three downstairs
// and the links between them, the workload and its oracle.
type world struct {
	cfg   Config
	spec  extent.Spec
	s     *scheduler
	ds    [engine.ReplicaCount]*dsNode
	up    [upstairsMax]*upNode
	cur   int // the upstairs the workload uses
	links [upstairsMax][engine.ReplicaCount]*link
	// partitionUntil keeps a link down until a tick.
	partitionUntil [upstairsMax][engine.ReplicaCount]Tick
	epochs         uint64

	faulting bool
	// recovering: every downstairs crashed at once (crashAll) and not all
	// are Active again. No bit flips meanwhile: the crash leaves blocks
	// damaged on several replicas, and a flip on top would be a further
	// failure (on the only Active source, say, it stalls live repair).
	recovering bool
	faultNo    int
	res        Result
	stopped    bool
	// compared: compareReplicas ran (and counted Lost).
	compared bool

	oracle oracle
	// flipped marks blocks of a replica that a bit flip damaged.
	flipped [engine.ReplicaCount]map[uint64]bool
}

// Run runs one simulation.
func Run(cfg Config) Result {
	w := &world{cfg: cfg, s: newScheduler(cfg.Seed, cfg.KeepTrace)}
	w.res.Seed = cfg.Seed
	w.spec = extent.NewSpec(512, 8, 4)
	w.spec.UUID = uuid.UUID{0x51, 0x4d}
	w.oracle.init(w.spec.Blocks())
	if err := w.run(); err != nil {
		w.violate("%v", err)
	}
	if !w.compared {
		w.res.Lost = w.countLost()
	}
	w.res.Events = w.s.events
	w.res.TraceHash = w.s.hash()
	w.res.Trace = w.s.lines
	return w.res
}

func (w *world) run() error {
	for r := range w.ds {
		d := &dsNode{w: w, id: r}
		if err := d.replace(); err != nil {
			return err
		}
		w.ds[r] = d
		w.flipped[r] = map[uint64]bool{}
	}
	for u := range upstairsMax {
		for r := range w.ds {
			w.links[u][r] = &link{w: w, up: u, ds: r}
		}
	}
	w.up[0] = newUpNode(w, 0, 1)
	w.up[0].start()
	w.faulting = true
	end := Tick(w.cfg.Steps)
	w.s.after(end, "faults stop", w.heal)
	// Each tick schedules the next, so runs that differ only in Steps
	// share their prefix (which lets Shrink cut a run short).
	w.s.after(0, "tick", w.tick)
	for !w.stopped && w.s.step() {
		w.checkStep()
		if !w.faulting && w.s.now > end && w.converged() {
			break
		}
		if w.s.now > end+50_000 {
			w.violate("no convergence 50000 ticks after faults stopped: %s", w.describe())
		}
	}
	if w.stopped {
		return nil
	}
	return w.finish()
}

// violate records a broken invariant and stops the run.
func (w *world) violate(format string, args ...any) {
	if w.stopped {
		return
	}
	msg := fmt.Sprintf("tick %d: ", w.s.now) + fmt.Sprintf(format, args...)
	w.s.note("VIOLATION %s", msg)
	w.res.Violations = append(w.res.Violations, msg)
	w.stopped = true
}

// fault decides whether to inject a fault of kind now.
func (w *world) fault(kind faultKind) bool {
	if !w.faulting || !w.s.chance(w.cfg.Faults[kind]) {
		return false
	}
	n := w.faultNo
	w.faultNo++
	if w.cfg.Skip[n] {
		return false
	}
	w.res.Faults[kind]++
	w.res.Injected = append(w.res.Injected, n)
	w.s.note("fault#%d %v", n, kind)
	return true
}

func (w *world) link(u, r int) *link { return w.links[u][r] }

func (w *world) partitioned(u, r int) bool { return w.s.now < w.partitionUntil[u][r] }

// sessionGone ends the downstairs side of the session of u on r.
func (w *world) sessionGone(u, r int) {
	if s := w.ds[r].sessions[u]; s != nil {
		w.ds[r].endSession(s)
	}
}

// cut severs the link of u and r: the downstairs drops the session at
// once, the upstairs notices after a detection delay.
func (w *world) cut(u, r int) {
	l := w.link(u, r)
	if !l.open {
		return
	}
	epoch := l.epoch
	l.sever()
	w.sessionGone(u, r)
	up := w.up[u]
	w.s.after(w.s.between(1, 10), fmt.Sprintf("u%d notices loss of d%d", u, r), func() { up.lost(r, epoch) })
}

// tick is one step of the faulty phase: the workload, then the faults
// that are not about single packets.
func (w *world) tick() {
	if !w.faulting {
		return
	}
	if w.s.now+1 < Tick(w.cfg.Steps) {
		w.s.after(1, "tick", w.tick)
	}
	w.workload()
	r := w.s.intn(engine.ReplicaCount)
	if !w.othersHealthy(r) || w.up[1] != nil && w.cur == 0 {
		// The fault model: one replica out of service at a time (the
		// volume promises to survive one failure, not two), and none
		// while a takeover reconciles (it counts as the one). Message
		// faults and bit flips are not bounded.
		if !w.recovering && w.fault(faultBitFlip) {
			w.flipBit(r)
		}
		return
	}
	if w.othersHealthy(-1) {
		w.recovering = false
	}
	if w.fault(faultDisconnect) {
		u := w.cur
		w.s.note("disconnect u%d d%d", u, r)
		w.partitionUntil[u][r] = w.s.now + w.s.between(0, 300)
		w.cut(u, r)
	}
	if w.fault(faultCrash) && w.ds[r].alive() {
		w.crash(r)
	}
	if !w.recovering && w.fault(faultBitFlip) {
		w.flipBit(r)
	}
	if w.up[1] == nil && w.othersHealthy(-1) && w.fault(faultTakeover) {
		w.takeover()
	}
	if w.fault(faultReplace) {
		w.replace(r)
	}
	if w.up[1] == nil && w.othersHealthy(-1) && !w.anyFlipped() && w.fault(faultCrashAll) {
		w.crashAll()
	}
}

// lostEverywhere is told of a block every replica tore in one crash of
// the whole volume: its older writes, flushed or not, are gone from all
// three, which the volume's promise (one failure at a time) does not
// cover; it is counted, and the oracle holds the block to what is
// written after.
func (w *world) lostEverywhere(b uint64) {
	w.res.LostEverywhere++
	w.oracle.void(b)
}

// anyFlipped reports whether a replica holds a block a bit flip damaged
// and nothing rewrote since. A whole-volume crash then would be a second
// failure: with that replica the only one Active afterwards, live repair
// of the others stalls on the damaged block (no scrub finds it first).
func (w *world) anyFlipped() bool {
	for r := range w.flipped {
		if len(w.flipped[r]) > 0 {
			return true
		}
	}
	return false
}

// crashAll crashes every downstairs at once: one loses power (keeping a
// random prefix of its unsynced writes, maybe tearing the last), the
// others' processes are killed (their disks keep every write), as when
// the three processes are killed together and one host also loses power.
// Damage on two replicas at once (a flushed block overwritten, its new
// data or hash half on disk, on both replicas that flushed it) is two
// failures, which the volume does not promise to survive. What the
// upstairs had acknowledged but not flushed may be gone (retired, and the
// reconciliation's source for its extent lost it), so the floor a read is
// held to falls back to the durable writes.
func (w *world) crashAll() {
	w.s.note("crash every downstairs")
	w.recovering = true
	cut := w.s.intn(engine.ReplicaCount)
	for r := range w.ds {
		w.crashOne(r, r == cut)
	}
	w.oracle.crashAll()
}

// othersHealthy reports whether every replica but r is alive and Active
// in the current upstairs.
func (w *world) othersHealthy(r int) bool {
	u := w.up[w.cur]
	for s := range engine.ReplicaCount {
		if s != r && (!w.ds[s].alive() || u.eng.State(s) != engine.ReplicaActive) {
			return false
		}
	}
	return true
}

func (w *world) crash(r int) { w.crashOne(r, true) }

// crashOne crashes downstairs r (a power cut, or only its process) and
// restarts it later.
func (w *world) crashOne(r int, power bool) {
	w.ds[r].crash(power, power)
	for u := range upstairsMax {
		if w.up[u] != nil {
			w.cut(u, r)
		}
	}
	w.s.after(w.s.between(20, 300), fmt.Sprintf("d%d restart", r), func() {
		if err := w.ds[r].restart(); err != nil {
			w.violate("%v", err)
		}
	})
}

// flipBit flips a bit of a random block's data on r's disk. Damage at
// rest counts against the one-failure budget too: no replica is damaged
// while another still holds an unrepaired flip.
func (w *world) flipBit(r int) {
	for s := range engine.ReplicaCount {
		if s != r && len(w.flipped[s]) > 0 {
			return
		}
	}
	b := w.s.rng.Uint64N(w.spec.Blocks())
	eb := uint64(w.spec.ExtentBlocks)
	name := fmt.Sprintf("%06d.ext", b/eb)
	off := int64(b%eb)*int64(w.spec.BlockSize) + int64(w.s.intn(int(w.spec.BlockSize)))
	if w.ds[r].disk.flipBit(name, off, uint(w.s.intn(8))) {
		w.s.note("bitflip d%d block %d", r, b)
		w.flipped[r][b] = true
	}
}

// replace swaps r's region for an empty one, as an operator replacing a
// failed replica does; the upstairs takes it back by live repair.
func (w *world) replace(r int) {
	u := w.up[w.cur]
	if !u.running() {
		return
	}
	for v := range upstairsMax {
		if w.up[v] != nil {
			w.cut(v, r)
		}
	}
	if err := w.ds[r].replace(); err != nil {
		w.violate("%v", err)
		return
	}
	clear(w.flipped[r])
	w.s.note("replace d%d", r)
	u.eng.Fault(r)
	u.apply()
}

// heal ends the faulty phase: partitions end, crashed downstairs restart.
func (w *world) heal() {
	w.faulting = false
	for u := range upstairsMax {
		for r := range engine.ReplicaCount {
			w.partitionUntil[u][r] = 0
		}
	}
	for _, d := range w.ds {
		if !d.alive() {
			if err := d.restart(); err != nil {
				w.violate("%v", err)
			}
		}
	}
}

// converged reports whether the current upstairs has every replica
// Active with nothing in flight.
func (w *world) converged() bool {
	if w.up[1] != nil && w.cur == 0 {
		return false // a takeover is still reconciling
	}
	u := w.up[w.cur]
	if !u.running() {
		return true
	}
	for r := range engine.ReplicaCount {
		if u.eng.State(r) != engine.ReplicaActive || !u.conns[r].activated {
			return false
		}
	}
	jobs, _ := u.eng.Live()
	return jobs == 0
}

func (w *world) describe() string {
	u := w.up[w.cur]
	jobs, _ := u.eng.Live()
	s := fmt.Sprintf("u%d running=%v live=%d", u.n, u.running(), jobs)
	for r := range engine.ReplicaCount {
		o, _ := u.eng.Owed(r)
		s += fmt.Sprintf(" d%d=%v(owed %d, epoch %d, activated %v, alive %v)", r, u.eng.State(r), o, u.conns[r].epoch, u.conns[r].activated, w.ds[r].alive())
	}
	return s
}

// checkStep checks the invariants that hold after every step.
func (w *world) checkStep() {
	for _, u := range w.up {
		if u == nil || !u.eng.Running() {
			continue
		}
		jobs, _ := u.eng.Live()
		// Callers block at InflightJobs; read repairs and rewrites may
		// add as many again (doc.go: twice the bound).
		if jobs > 2*w.cfg.InflightJobs {
			w.violate("u%d holds %d live jobs, bound %d", u.n, jobs, 2*w.cfg.InflightJobs)
		}
		for r := range engine.ReplicaCount {
			// The backlog bound holds while a replica is Active (with
			// none, the in-flight bound does: engine.checkBacklogs).
			if o, _ := u.eng.Owed(r); u.eng.State(r) == engine.ReplicaOffline && o > w.cfg.BacklogJobs && u.eng.AnyActive() {
				w.violate("u%d: offline d%d owes %d jobs, backlog bound %d", u.n, r, o, w.cfg.BacklogJobs)
			}
		}
	}
}

// checkNotFenced is called as a mutation from session s applies on d: no
// upstairs fenced by a higher generation may change the region.
func (w *world) checkNotFenced(d *dsNode, s *dsSession) {
	if g := ids.Generation(d.region.HighestGen()); g > s.gen {
		w.violate("d%d applies a mutation of u%d at gen %d after gen %d took over", d.id, s.up, s.gen, g)
	}
}

// applied is told of every write a downstairs applied.
func (w *world) applied(r, u int, m *message) {
	for i := range m.count {
		b := uint64(m.first) + uint64(i)
		delete(w.flipped[r], b)
	}
}

// workload submits the callers' IO to the current upstairs.
func (w *world) workload() {
	u := w.up[w.cur]
	if !u.running() || w.s.chance(0.4) {
		return
	}
	eb := w.spec.ExtentBlocks
	e := uint32(w.s.intn(int(w.spec.ExtentCount)))
	off := uint32(w.s.intn(int(eb)))
	count := 1 + uint32(w.s.intn(int(min(3, eb-off))))
	first := ids.BlockIndex(e*eb + off)
	switch n := w.s.intn(100); {
	case n < 50:
		val := w.oracle.nextValue()
		data := make([]byte, int(count)*int(w.spec.BlockSize))
		for i := range count {
			fillBlock(data[int(i)*int(w.spec.BlockSize):][:w.spec.BlockSize], val, uint64(first)+uint64(i))
		}
		if id, ok := u.submit(engine.KindWrite, first, count, data); ok {
			w.oracle.submitWrite(u.n, id, val, uint64(first), count)
			w.s.note("u%d write %d [%d,+%d) value %d", u.n, id, first, count, val)
			u.apply()
		} else {
			w.oracle.unused(val)
		}
	case n < 88:
		if id, ok := u.submit(engine.KindRead, first, count, nil); ok {
			w.oracle.submitRead(u.n, id, uint64(first), count)
			w.s.note("u%d read %d [%d,+%d)", u.n, id, first, count)
			u.apply()
		}
	default:
		if id, ok := u.submit(engine.KindFlush, 0, 0, nil); ok {
			w.oracle.submitFlush(u.n, id)
			w.s.note("u%d flush %d", u.n, id)
			u.apply()
		}
	}
}

// completed is told of every caller job's completion.
func (w *world) completed(u *upNode, id wire.JobID, j *ujob, err error) {
	w.s.note("u%d complete %v %d err=%v", u.n, j.kind, id, err)
	switch j.kind {
	case engine.KindWrite:
		w.oracle.writeDone(u.n, id, err == nil)
		if err == nil {
			w.res.WritesAcked++
		}
	case engine.KindFlush:
		w.oracle.flushDone(u.n, id, err == nil)
		if err == nil {
			w.res.FlushesAcked++
		}
	case engine.KindRead:
		if err != nil {
			w.oracle.readDone(u.n, id)
			return
		}
		bs := int(w.spec.BlockSize)
		for i := range j.count {
			b := uint64(j.first) + uint64(i)
			if msg := w.oracle.checkRead(u.n, id, b, decodeBlock(j.buf[int(i)*bs:][:bs], b)); msg != "" {
				w.violate("u%d read %d: %s", u.n, id, msg)
				return
			}
		}
		w.oracle.readDone(u.n, id)
	}
}

// fillBlock writes block b's content for value val: the value, the
// block number, then bytes derived from both, so a block read back names
// the write it came from and any damage shows.
func fillBlock(p []byte, val, b uint64) {
	binary.LittleEndian.PutUint64(p[0:], val)
	binary.LittleEndian.PutUint64(p[8:], b)
	rng := rand.New(rand.NewPCG(val, b))
	for i := 16; i+8 <= len(p); i += 8 {
		binary.LittleEndian.PutUint64(p[i:], rng.Uint64())
	}
}

// decodeBlock returns the value of a block read back at b: 0 for a
// never-written block, noValue for content no write of b produced.
func decodeBlock(p []byte, b uint64) uint64 {
	val := binary.LittleEndian.Uint64(p)
	want := make([]byte, len(p))
	if val != 0 {
		fillBlock(want, val, b)
	}
	if string(want) != string(p) {
		return noValue
	}
	return val
}

func (w *world) hashBlocks(p []byte) []uint64 {
	bs := int(w.spec.BlockSize)
	hs := make([]uint64, len(p)/bs)
	for i := range hs {
		hs[i] = xxhash.Sum64(p[i*bs : (i+1)*bs])
	}
	return hs
}

// noProgress starts the violation of a run that did nothing.
const noProgress = "no progress"

// finish runs after convergence: a final flush, which must succeed,
// then the replicas must be identical and hold every acknowledged,
// flushed write, and the run must have done something.
func (w *world) finish() error {
	u := w.up[w.cur]
	if u.running() {
		acked := w.res.FlushesAcked
		id, ok := u.submit(engine.KindFlush, 0, 0, nil)
		if ok {
			w.oracle.submitFlush(u.n, id)
			u.apply()
		}
		for !w.stopped && w.s.step() {
			w.checkStep()
			if w.converged() && !w.oracle.pendingFlush(u.n, id) {
				break
			}
		}
		if !w.stopped && (!ok || w.res.FlushesAcked == acked) {
			w.violate("the final flush failed")
		}
	}
	if w.stopped {
		return nil
	}
	if w.res.WritesAcked == 0 || w.res.FlushesAcked == 0 {
		w.violate("%s: %d writes and %d flushes acknowledged", noProgress, w.res.WritesAcked, w.res.FlushesAcked)
		return nil
	}
	return w.compareReplicas()
}

// compareReplicas checks that the three regions hold the same blocks and
// that none lost an acknowledged, flushed write. It records the first
// violation and counts every lost block.
func (w *world) compareReplicas() error {
	w.compared = true
	bs := int(w.spec.BlockSize)
	var blocks [engine.ReplicaCount][]byte
	for r, d := range w.ds {
		if !d.alive() {
			return fmt.Errorf("compare replicas: d%d is down", r)
		}
		blocks[r] = make([]byte, int(w.spec.Blocks())*bs)
		hs := make([]uint64, w.spec.Blocks())
		if err := d.region.ReadBlocks(0, blocks[r], hs); err != nil {
			w.res.Lost = w.countLost()
			return fmt.Errorf("compare replicas: read d%d: %w", r, err)
		}
		for b, h := range hs {
			if xxhash.Sum64(blocks[r][b*bs:(b+1)*bs]) != h {
				if w.flipped[r][uint64(b)] {
					w.res.Latent++ // excluded below
					continue
				}
				w.violate("d%d block %d does not match its recorded hash", r, b)
			}
		}
	}
	for b := range w.spec.Blocks() {
		ref := -1
		for r := range engine.ReplicaCount {
			if !w.flipped[r][b] {
				ref = r
				break
			}
		}
		if ref < 0 {
			continue
		}
		p0 := blocks[ref][int(b)*bs:][:bs]
		for r := ref + 1; r < engine.ReplicaCount; r++ {
			if w.flipped[r][b] {
				continue
			}
			if string(blocks[r][int(b)*bs:][:bs]) != string(p0) {
				w.violate("replicas differ at block %d: d%d has %d, d%d has %d", b,
					ref, decodeBlock(p0, b), r, decodeBlock(blocks[r][int(b)*bs:][:bs], b))
			}
		}
		for r := range engine.ReplicaCount {
			if w.flipped[r][b] {
				continue
			}
			v := decodeBlock(blocks[r][int(b)*bs:][:bs], b)
			if msg := w.oracle.checkDurable(b, v); msg != "" {
				w.res.Lost++
				w.violate("d%d block %d: %s", r, b, msg)
				break
			}
		}
	}
	return nil
}

// countLost counts, when a violation stopped the run before the final
// comparison, the blocks whose acknowledged, flushed data no replica
// holds (nor a newer write of the block): what the volume could no
// longer give back however it went on. A crashed downstairs is restarted
// to read its disk; a replica's block that a bit flip damaged, or that it
// refuses to read, does not hold it.
func (w *world) countLost() int {
	bs := int(w.spec.BlockSize)
	for _, d := range w.ds {
		if !d.alive() {
			_ = d.restart()
		}
	}
	buf := make([]byte, bs)
	h := make([]uint64, 1)
	lost := 0
	for b := range w.spec.Blocks() {
		held := false
		for r, d := range w.ds {
			if !d.alive() || w.flipped[r][b] {
				continue
			}
			if err := d.region.ReadBlocks(ids.BlockIndex(b), buf, h); err != nil || xxhash.Sum64(buf) != h[0] {
				continue
			}
			if w.oracle.checkDurable(b, decodeBlock(buf, b)) == "" {
				held = true
				break
			}
		}
		if !held {
			lost++
		}
	}
	return lost
}
