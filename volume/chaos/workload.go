package chaos

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"tern/volume/upstairs"
)

// historyLen bounds how many acknowledged versions of a block a Workload
// remembers, to tell a lost write from a stale one.
const historyLen = 32

// Workload writes versioned patterns to a volume and remembers, per block,
// which versions were acknowledged, which were covered by an acknowledged
// flush, and which failed (their outcome unknown), so Verify can tell
// correct data from stale, lost and corrupt.
//
// Each lane is one writer goroutine, sequential, on its own range of
// blocks: within a lane a block's versions are totally ordered, so the
// latest acknowledged one is what a read must return.
type Workload struct {
	blockSize int
	blocks    uint64
	seed      uint64
	seq       atomic.Uint64

	mu     sync.Mutex
	state  []blockState  // guarded by mu; by block
	counts WorkloadStats // guarded by mu
}

type blockState struct {
	acked   []uint64 // acknowledged versions, oldest first, at most historyLen
	durable uint64   // the latest version acknowledged before a flush's ack
	failed  []uint64 // versions whose write failed after the latest ack
}

// WorkloadStats counts a workload's work and findings.
type WorkloadStats struct {
	WritesAcked, WritesFailed   int64
	FlushesAcked, FlushesFailed int64
	// FlushesRestarted are the failed flushes that were in flight when
	// every replica restarted (upstairs.ErrRestarted): they promise
	// nothing, so their writes stay uncovered.
	FlushesRestarted int64
	ReadsVerified    int64
	// Mismatches are reads, during the workload, that did not return the
	// version just acknowledged.
	Mismatches int64
	// FirstIOError is why the first failed write or flush failed, and
	// FirstFailStatus the upstairs' replicas after the first failed write.
	FirstIOError, FirstFailStatus string
}

// VerifyReport classifies every block of the volume after a Verify.
type VerifyReport struct {
	Blocks int64
	// OK blocks hold their latest acknowledged version (or a later one
	// whose write failed, or nothing when nothing was acknowledged).
	OK int64
	// Stale blocks hold an older acknowledged version, still at or after
	// the one a flush covered; Lost ones hold something older than that
	// (or nothing); Corrupt ones hold no version ever written.
	Stale, Lost, Corrupt int64
	// First describes the first bad block found.
	First string
}

// Violations is the number of blocks that are not OK.
func (r VerifyReport) Violations() int64 { return r.Stale + r.Lost + r.Corrupt }

// NewWorkload tracks a volume of blocks blocks of blockSize bytes.
func NewWorkload(blockSize int, blocks uint64, seed uint64) *Workload {
	return &Workload{blockSize: blockSize, blocks: blocks, seed: seed, state: make([]blockState, blocks)}
}

// Stats returns the counts so far.
func (w *Workload) Stats() WorkloadStats {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.counts
}

func (w *Workload) versionSeed(v uint64) uint64 { return w.seed ^ (v * 0x9e3779b97f4a7c15) }

// LaneSpec is what one writer does.
type LaneSpec struct {
	// First and Blocks are the lane's range of blocks.
	First, Blocks uint64
	// MaxIOBlocks bounds each write's length (at least 1).
	MaxIOBlocks int
	// FlushEvery is how many writes go between flushes (0: never).
	FlushEvery int
	// ReadBack reads every acknowledged write back at once and checks it.
	ReadBack bool
	// IOTimeout bounds each IO; a timed-out write counts as failed.
	IOTimeout time.Duration
	// Seed picks offsets and lengths.
	Seed uint64
}

// RunLane writes until stop is closed or ctx ends, after at most
// maxWrites writes (0: no bound). It returns the first error other than a
// failed IO (which is counted, not returned), or ctx's.
func (w *Workload) RunLane(ctx context.Context, u *upstairs.Upstairs, spec LaneSpec, stop <-chan struct{}, maxWrites int) error {
	r := rand.New(rand.NewPCG(spec.Seed, spec.Seed^0xa0761d6478bd642f))
	maxBlocks := max(1, min(spec.MaxIOBlocks, int(spec.Blocks)))
	buf := make([]byte, maxBlocks*w.blockSize)
	check := make([]byte, len(buf))
	scratch := make([]byte, w.blockSize)
	var sinceFlush []written
	for n := 0; maxWrites == 0 || n < maxWrites; n++ {
		select {
		case <-stop:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		count := 1 + r.IntN(maxBlocks)
		first := spec.First + r.Uint64N(spec.Blocks-uint64(count)+1)
		v := w.seq.Add(1)
		p := buf[:count*w.blockSize]
		upstairs.FillPattern(p, w.blockSize, first, w.versionSeed(v))
		if err := w.io(ctx, spec.IOTimeout, func(ctx context.Context) error {
			_, err := u.WriteAt(ctx, p, int64(first)*int64(w.blockSize))
			return err
		}); err != nil {
			w.recordFailed(first, count, v)
			w.noteStatus(u)
			if ctx.Err() != nil {
				return ctx.Err()
			}
			continue
		}
		w.recordAcked(first, count, v)
		sinceFlush = append(sinceFlush, written{first, count, v})
		if spec.ReadBack {
			c := check[:len(p)]
			err := w.io(ctx, spec.IOTimeout, func(ctx context.Context) error {
				_, err := u.ReadAt(ctx, c, int64(first)*int64(w.blockSize))
				return err
			})
			if err == nil {
				_, bad := upstairs.CheckPattern(c, w.blockSize, first, w.versionSeed(v), scratch)
				w.mu.Lock()
				w.counts.ReadsVerified++
				if bad {
					w.counts.Mismatches++
				}
				w.mu.Unlock()
			}
		}
		if spec.FlushEvery > 0 && len(sinceFlush) >= spec.FlushEvery {
			if err := w.io(ctx, spec.IOTimeout, u.Flush); err != nil {
				w.mu.Lock()
				w.counts.FlushesFailed++
				if errors.Is(err, upstairs.ErrRestarted) {
					w.counts.FlushesRestarted++
				}
				w.mu.Unlock()
				continue // the writes stay uncovered until a later flush
			}
			w.recordDurable(sinceFlush)
			sinceFlush = sinceFlush[:0]
		}
	}
	return nil
}

type written struct {
	first   uint64
	count   int
	version uint64
}

func (w *Workload) io(ctx context.Context, timeout time.Duration, f func(context.Context) error) error {
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	err := f(ctx)
	if err != nil {
		w.mu.Lock()
		if w.counts.FirstIOError == "" {
			w.counts.FirstIOError = err.Error()
		}
		w.mu.Unlock()
	}
	return err
}

func (w *Workload) recordAcked(first uint64, count int, v uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.counts.WritesAcked++
	for b := first; b < first+uint64(count); b++ {
		s := &w.state[b]
		if len(s.acked) == historyLen {
			s.acked = append(s.acked[:0], s.acked[1:]...)
		}
		s.acked = append(s.acked, v)
		s.failed = s.failed[:0]
	}
}

// noteStatus records u's status after the first failed write.
func (w *Workload) noteStatus(u *upstairs.Upstairs) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.counts.FirstFailStatus == "" {
		w.counts.FirstFailStatus = describeStatus(u.Status())
	}
}

func (w *Workload) recordFailed(first uint64, count int, v uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.counts.WritesFailed++
	for b := first; b < first+uint64(count); b++ {
		s := &w.state[b]
		if len(s.failed) < historyLen {
			s.failed = append(s.failed, v)
		}
	}
}

// recordDurable marks writes acknowledged before a flush that was then
// acknowledged as covered by it.
func (w *Workload) recordDurable(ws []written) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.counts.FlushesAcked++
	for _, x := range ws {
		for b := x.first; b < x.first+uint64(x.count); b++ {
			w.state[b].durable = max(w.state[b].durable, x.version)
		}
	}
}

// Verify reads every block through u and classifies it. Only call it
// while no lane runs.
func (w *Workload) Verify(ctx context.Context, u *upstairs.Upstairs, chunkBlocks int) (VerifyReport, error) {
	rep := VerifyReport{}
	buf := make([]byte, chunkBlocks*w.blockSize)
	want := make([]byte, w.blockSize)
	for first := uint64(0); first < w.blocks; first += uint64(chunkBlocks) {
		n := min(uint64(chunkBlocks), w.blocks-first)
		p := buf[:n*uint64(w.blockSize)]
		if _, err := u.ReadAt(ctx, p, int64(first)*int64(w.blockSize)); err != nil {
			return rep, fmt.Errorf("reading blocks %d+%d: %w", first, n, err)
		}
		w.mu.Lock()
		for i := range n {
			b := first + i
			got := p[i*uint64(w.blockSize) : (i+1)*uint64(w.blockSize)]
			w.classifyLocked(&rep, b, got, want)
		}
		w.mu.Unlock()
	}
	return rep, nil
}

func (w *Workload) classifyLocked(rep *VerifyReport, b uint64, got, want []byte) {
	rep.Blocks++
	s := &w.state[b]
	holds := func(v uint64) bool {
		if v == 0 {
			return !bytes.ContainsFunc(got, func(r rune) bool { return r != 0 })
		}
		upstairs.FillPattern(want, w.blockSize, b, w.versionSeed(v))
		return bytes.Equal(got, want)
	}
	var latest uint64
	if len(s.acked) > 0 {
		latest = s.acked[len(s.acked)-1]
	}
	if holds(latest) {
		rep.OK++
		return
	}
	for _, v := range s.failed {
		if holds(v) {
			rep.OK++
			return
		}
	}
	bad := func(kind string, n *int64) {
		*n++
		if rep.First == "" {
			rep.First = fmt.Sprintf("block %d is %s (latest acknowledged version %d, flushed %d)", b, kind, latest, s.durable)
		}
	}
	for i := len(s.acked) - 2; i >= 0; i-- {
		if holds(s.acked[i]) {
			if s.acked[i] >= s.durable {
				bad("stale", &rep.Stale)
			} else {
				bad("lost", &rep.Lost)
			}
			return
		}
	}
	if holds(0) {
		if s.durable > 0 {
			bad("lost", &rep.Lost)
		} else {
			bad("stale", &rep.Stale)
		}
		return
	}
	bad("corrupt", &rep.Corrupt)
}

// Lanes are workload lanes running in the background on equal, disjoint
// ranges of the volume until Stop.
type Lanes struct {
	stop    chan struct{}
	wg      sync.WaitGroup
	mu      sync.Mutex
	err     error // guarded by mu; the first lane's error
	stopped bool
}

// StartLanes starts n lanes of spec over the whole volume, each on its own
// range and seed (spec.Seed+i).
func (w *Workload) StartLanes(ctx context.Context, u *upstairs.Upstairs, n int, spec LaneSpec) *Lanes {
	l := &Lanes{stop: make(chan struct{})}
	per := w.blocks / uint64(n)
	for i := range n {
		s := spec
		s.First, s.Blocks, s.Seed = uint64(i)*per, per, spec.Seed+uint64(i)
		l.wg.Go(func() {
			if err := w.RunLane(ctx, u, s, l.stop, 0); err != nil {
				l.mu.Lock()
				if l.err == nil {
					l.err = err
				}
				l.mu.Unlock()
			}
		})
	}
	return l
}

// Stop stops the lanes, waits for them and returns the first error.
func (l *Lanes) Stop() error {
	if !l.stopped {
		l.stopped = true
		close(l.stop)
	}
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// WaitAcked waits until at least n writes were acknowledged in all,
// polling, for at most timeout.
func (w *Workload) WaitAcked(ctx context.Context, n int64, timeout time.Duration) error {
	return waitUntil(ctx, timeout, func() bool { return w.Stats().WritesAcked >= n },
		func() string { return fmt.Sprintf("%d of %d writes acknowledged", w.Stats().WritesAcked, n) })
}

// waitUntil polls cond every few milliseconds until it holds, or fails
// after timeout saying what it saw.
func waitUntil(ctx context.Context, timeout time.Duration, cond func() bool, saw func() string) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting: %w (%s)", ctx.Err(), saw())
		case <-deadline.C:
			return fmt.Errorf("waiting: not within %v: %s", timeout, saw())
		case <-tick.C:
		}
	}
	return nil
}
