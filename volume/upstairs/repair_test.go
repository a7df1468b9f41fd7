package upstairs

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"tern/volume/extent"
	"tern/volume/ids"
	"tern/volume/reconcile"
	"tern/volume/upstairs/engine"
)

// divergence writes blocks (region block numbers) of pattern seed straight
// into replica d's region while it is stopped, then flushes with
// (flush, gen) unless flush is 0 (the extents stay dirty). It restarts d
// unless keepStopped.
func (d *testDownstairs) diverge(blocks []uint64, seed uint64, flush uint64, gen ids.Generation, keepStopped bool) {
	d.t.Helper()
	d.stop()
	r, err := extent.Open(d.dir)
	if err != nil {
		d.t.Fatal(err)
	}
	buf := make([]byte, testBlockSize)
	h := make([]uint64, 1)
	for _, b := range blocks {
		FillPattern(buf, testBlockSize, b, seed)
		hashBlocks(h, buf, testBlockSize)
		if err := r.WriteBlocks(ids.BlockIndex(b), buf, h); err != nil {
			d.t.Fatal(err)
		}
	}
	if flush != 0 {
		if err := r.Flush(flush, gen); err != nil {
			d.t.Fatal(err)
		}
	}
	if err := r.Close(); err != nil {
		d.t.Fatal(err)
	}
	if !keepStopped {
		d.start()
	}
}

// overlay returns base with blocks replaced by pattern seed.
func overlay(base []byte, blocks []uint64, seed uint64) []byte {
	out := bytes.Clone(base)
	for _, b := range blocks {
		FillPattern(out[b*testBlockSize:(b+1)*testBlockSize], testBlockSize, b, seed)
	}
	return out
}

// baseVolume writes pattern 1 over the whole volume at generation 1 and
// closes the upstairs, leaving three identical, flushed replicas.
func baseVolume(t *testing.T, c *cluster) []byte {
	t.Helper()
	u := c.open(c.config(), 1)
	want := writePattern(t, u, 1)
	if err := u.Close(); err != nil {
		t.Fatal(err)
	}
	return want
}

// readVolume reads the whole volume through u.
func readVolume(t *testing.T, u *Upstairs) []byte {
	t.Helper()
	got := make([]byte, volumeBytes())
	for off := int64(0); off < volumeBytes(); off += 256 << 10 {
		if _, err := u.ReadAt(ctxT(t), got[off:off+256<<10], off); err != nil {
			t.Fatal(err)
		}
	}
	return got
}

// waitFinal reads ch to its end and returns every value received.
func waitFinal(t *testing.T, ch <-chan reconcile.Progress) []reconcile.Progress {
	t.Helper()
	var got []reconcile.Progress
	timeout := time.After(testTimeout)
	for {
		select {
		case p, ok := <-ch:
			if !ok {
				if len(got) == 0 {
					t.Fatal("progress channel closed without a value")
				}
				return got
			}
			got = append(got, p)
		case <-timeout:
			t.Fatalf("no final progress; last %+v", got)
		}
	}
}

// requireMonotone fails unless the snapshots only move forward.
func requireMonotone(t *testing.T, ps []reconcile.Progress) {
	t.Helper()
	for i := 1; i < len(ps); i++ {
		a, b := ps[i-1], ps[i]
		if b.ExtentsDone < a.ExtentsDone || b.ExtentsTotal < a.ExtentsTotal || b.BytesDone < a.BytesDone ||
			b.BytesTotal < a.BytesTotal || b.BlocksCompared < a.BlocksCompared || b.UpdatedAt.Before(a.UpdatedAt) {
			t.Fatalf("progress went backwards: %+v then %+v", a, b)
		}
	}
}

func TestActivationRepairsEveryDivergenceShape(t *testing.T) {
	for _, tc := range []struct {
		name string
		// diverge makes the replicas differ and returns the expected
		// volume and the number of blocks activation must copy.
		diverge func(c *cluster, base []byte) ([]byte, uint64)
		missing int // replica left out of the activation, -1 for none
	}{
		{"one dirty", func(c *cluster, base []byte) ([]byte, uint64) {
			blocks := []uint64{70, 71, 300}
			c.ds[1].diverge(blocks, 2, 0, 0, false)
			// The dirty copy wins and goes to both others.
			return overlay(base, blocks, 2), 2 * 3
		}, -1},
		{"flush differs", func(c *cluster, base []byte) ([]byte, uint64) {
			blocks := []uint64{5, 130}
			c.ds[2].diverge(blocks, 3, 100, 1, false)
			return overlay(base, blocks, 3), 2 * 2
		}, -1},
		{"gen differs", func(c *cluster, base []byte) ([]byte, uint64) {
			blocks := []uint64{200}
			c.ds[0].diverge(blocks, 4, 1, 3, false)
			return overlay(base, blocks, 4), 2 * 1
		}, -1},
		{"all three differ", func(c *cluster, base []byte) ([]byte, uint64) {
			c.ds[0].diverge([]uint64{384, 385}, 5, 50, 1, false)
			c.ds[1].diverge([]uint64{390}, 6, 51, 1, false)
			c.ds[2].diverge([]uint64{400, 401, 402}, 7, 52, 1, false)
			// Replica 2 wins extent 6: replica 0 differs in 5 blocks,
			// replica 1 in 4.
			return overlay(base, []uint64{400, 401, 402}, 7), 5 + 4
		}, -1},
		{"one replica missing", func(c *cluster, base []byte) ([]byte, uint64) {
			c.ds[1].diverge([]uint64{10}, 8, 0, 0, false)
			c.ds[2].stop()
			return overlay(base, []uint64{10}, 8), 1
		}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t)
			want, copies := tc.diverge(c, baseVolume(t, c))
			cfg := c.config()
			if tc.missing >= 0 {
				// Only then: with all three up, a short wait would let a
				// replica slow to answer on a loaded machine miss the
				// activation and change what it must copy.
				cfg.ActivationQuorumWait = 100 * time.Millisecond
			}
			u := c.open(cfg, 5)
			st := u.RepairStats()
			if st.BlocksCopied != copies || st.BytesCopied != copies*testBlockSize {
				t.Fatalf("activation copied %d blocks (%d bytes), want only the %d that differ", st.BlocksCopied, st.BytesCopied, copies)
			}
			if p := u.ActivationProgress(); p.Phase != reconcile.PhaseDone || p.BytesDone != copies*testBlockSize {
				t.Fatalf("activation progress %+v", p)
			}
			if got := readVolume(t, u); !bytes.Equal(got, want) {
				t.Fatal("volume differs from the winning replica's data")
			}
			if tc.missing >= 0 {
				// The absent replica catches up by live repair.
				ch, cancel := u.SubscribeLiveRepair(tc.missing, 4)
				defer cancel()
				c.ds[tc.missing].start()
				if last := waitFinal(t, ch); last[len(last)-1].Phase != reconcile.PhaseDone {
					t.Fatalf("live repair ended %+v", last[len(last)-1])
				}
				waitState(t, u, tc.missing, engine.ReplicaActive)
			}
			if err := u.Close(); err != nil {
				t.Fatal(err)
			}
			c.requireSameReplicas(want)
		})
	}
}

func TestWholeExtentModeCopiesWholeExtents(t *testing.T) {
	c := newCluster(t)
	base := baseVolume(t, c)
	blocks := []uint64{70, 300}
	c.ds[1].diverge(blocks, 2, 0, 0, false)
	cfg := c.config()
	cfg.RepairWholeExtents = true
	u := c.open(cfg, 2)
	// Two extents, each to two destinations, every block.
	if got, want := u.RepairStats().BlocksCopied, uint64(2*2*testExtentBlocks); got != want {
		t.Fatalf("whole-extent mode copied %d blocks, want %d", got, want)
	}
	if u.RepairStats().BlocksCompared != 0 {
		t.Fatal("whole-extent mode compared hashes")
	}
	u.Close()
	c.requireSameReplicas(overlay(base, blocks, 2))
}

// TestSourceLostMidReconciliationThenRetried kills the source between two
// extents: Activate fails, every extent is either repaired or untouched,
// and an activation at a higher generation finishes the job.
func TestSourceLostMidReconciliationThenRetried(t *testing.T) {
	c := newCluster(t)
	base := baseVolume(t, c)
	var blocks []uint64
	for e := range uint64(testExtentCount) {
		blocks = append(blocks, e*testExtentBlocks+1)
	}
	c.ds[0].diverge(blocks, 9, 0, 0, false) // replica 0 dirty everywhere: the source
	want := overlay(base, blocks, 9)

	u, err := New(c.config())
	if err != nil {
		t.Fatal(err)
	}
	u.hooks = &repairHooks{activationExtentDone: func(e ids.ExtentID) {
		if e == 2 {
			c.ds[0].stop()
		}
	}}
	if err := u.Activate(ctxT(t), 2); err == nil {
		t.Fatal("Activate succeeded without its source")
	}
	if p := u.ActivationProgress(); p.Phase != reconcile.PhaseError || p.ExtentsDone != 3 {
		t.Fatalf("failed activation progress %+v, want error after 3 extents", p)
	}
	u.Close()

	// Extents 0..2 are repaired on both destinations, 3..7 untouched.
	for _, i := range []int{1, 2} {
		c.ds[i].stop()
		r, err := extent.Open(c.ds[i].dir)
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, testBlockSize)
		h := make([]uint64, 1)
		for e, b := range blocks {
			if err := r.ReadBlocks(ids.BlockIndex(b), buf, h); err != nil {
				t.Fatal(err)
			}
			v, _ := r.ExtentVersion(ids.ExtentID(e))
			repaired := bytes.Equal(buf, want[b*testBlockSize:(b+1)*testBlockSize])
			untouched := bytes.Equal(buf, base[b*testBlockSize:(b+1)*testBlockSize])
			switch {
			case e <= 2 && (!repaired || v.Dirty || v.Gen != 2):
				t.Errorf("replica %d extent %d: repaired %v, version %+v; want repaired at generation 2", i, e, repaired, v)
			case e > 2 && (!untouched || v.Dirty || v.Gen != 1):
				t.Errorf("replica %d extent %d: untouched %v, version %+v; want untouched", i, e, untouched, v)
			}
		}
		r.Close()
		c.ds[i].start()
	}
	c.ds[0].start()

	u2 := c.open(c.config(), 3)
	if got, want := u2.RepairStats().BlocksCopied, uint64(2*5); got != want {
		t.Fatalf("retry copied %d blocks, want %d (the 5 extents left, to 2 replicas)", got, want)
	}
	u2.Close()
	c.requireSameReplicas(want)
}

// TestActivationProgressFinalReachesLateReader subscribes before Activate
// and reads nothing until it returned: the last value is the final 100%.
func TestActivationProgressFinalReachesLateReader(t *testing.T) {
	c := newCluster(t)
	baseVolume(t, c)
	c.ds[2].diverge([]uint64{1, 65, 129, 193}, 3, 0, 0, false)
	u, err := New(c.config())
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	late, cancelLate := u.SubscribeActivation(1)
	defer cancelLate()
	all, cancelAll := u.SubscribeActivation(1024)
	defer cancelAll()
	if err := u.Activate(ctxT(t), 2); err != nil {
		t.Fatal(err)
	}
	got := waitFinal(t, late)
	last := got[len(got)-1]
	if last.Phase != reconcile.PhaseDone || last.ExtentsDone != 4 || last.ExtentsTotal != 4 ||
		last.BytesDone != 8*testBlockSize || last.BytesTotal != last.BytesDone ||
		last.BlocksCompared != 8*testExtentBlocks {
		t.Fatalf("final progress %+v", last)
	}
	every := waitFinal(t, all)
	requireMonotone(t, every)
	var phases []string
	for _, p := range every {
		if n := len(phases); n == 0 || phases[n-1] != string(p.Phase) {
			phases = append(phases, string(p.Phase))
		}
	}
	if got := strings.Join(phases, ","); got != "negotiating,comparing,repairing,done" {
		t.Fatalf("phases %s", got)
	}
	if s := u.Status(); s.Activation != last {
		t.Fatalf("Status().Activation = %+v, want %+v", s.Activation, last)
	}
}

// TestLiveRepairUnderConcurrentWrites faults a replica by backlog overflow
// and brings it back while a writer keeps going; at each extent a write
// lands on the extent under repair, one before it and one after it.
func TestLiveRepairUnderConcurrentWrites(t *testing.T) {
	c := newCluster(t)
	cfg := c.config()
	cfg.BacklogJobs = 8
	u, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	ctx := ctxT(t)
	m := &model{data: make([]byte, volumeBytes())}
	// The hook writes odd blocks, the writer even ones, so the model is
	// exact whatever the interleaving.
	write := func(block uint64, seed uint64) {
		p := make([]byte, testBlockSize)
		FillPattern(p, testBlockSize, block, seed)
		if _, err := u.WriteAt(ctx, p, int64(block)*testBlockSize); err != nil {
			t.Error(err)
			return
		}
		m.write(p, int64(block)*testBlockSize)
	}
	var hookWrites atomic.Int64
	u.hooks = &repairHooks{liveExtentCompared: func(r int, e ids.ExtentID) {
		for _, x := range []int64{int64(e) - 1, int64(e), int64(e) + 1} {
			if x >= 0 && x < testExtentCount {
				write(uint64(x)*testExtentBlocks+uint64(2*rand.IntN(testExtentBlocks/2)+1), 77+uint64(e))
				hookWrites.Add(1)
			}
		}
	}}
	if err := u.Activate(ctx, 1); err != nil {
		t.Fatal(err)
	}
	copy(m.data, writePattern(t, u, 1))

	c.ds[1].stop()
	for i := range 30 {
		write(uint64(2*i), 2)
	}
	waitState(t, u, 1, engine.ReplicaFaulted)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		rng := rand.New(rand.NewPCG(1, 2))
		for i := uint64(0); ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			// Runs of even blocks, some spanning two extents.
			first := 2 * rng.Uint64N(uint64(volumeBytes()/testBlockSize)/2-4)
			for b := first; b < first+8; b += 2 {
				write(b, 1000+i)
			}
		}
	}()
	// Stop the writer before anything else ends the test, so it never
	// runs (and reports) after the test has returned.
	stopWriter := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer stopWriter()
	progress, cancel := u.SubscribeLiveRepair(1, 64)
	defer cancel()
	c.ds[1].start()
	got := waitFinal(t, progress)
	stopWriter()
	requireMonotone(t, got)
	if last := got[len(got)-1]; last.Phase != reconcile.PhaseDone || last.ExtentsDone != testExtentCount {
		t.Fatalf("live repair ended %+v", last)
	}
	if got[0].Phase != reconcile.PhaseNegotiating && got[0].Phase != reconcile.PhaseLiveRepair {
		t.Fatalf("first live-repair value %+v", got[0])
	}
	waitState(t, u, 1, engine.ReplicaActive)
	if hookWrites.Load() == 0 {
		t.Fatal("no write raced the repair")
	}
	if s := u.Status().Replicas[1]; s.Repair == nil || s.Repair.Phase != reconcile.PhaseDone {
		t.Fatalf("replica status %+v", s)
	}
	// A write after the repair reaches all three.
	write(3, 5)
	if err := u.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if got := readVolume(t, u); !bytes.Equal(got, m.data) {
		t.Fatal("volume differs from what was written")
	}
	if err := u.Close(); err != nil {
		t.Fatal(err)
	}
	c.requireSameReplicas(m.data)
}

// TestLiveRepairAbortedIsRetried stops the replica under repair midway:
// the attempt fails and leaves it faulted; it is repaired when it is back.
func TestLiveRepairAbortedIsRetried(t *testing.T) {
	c := newCluster(t)
	cfg := c.config()
	cfg.ActivationQuorumWait = 50 * time.Millisecond
	c.ds[2].stop()
	u, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	var once sync.Once
	stopped := make(chan struct{})
	u.hooks = &repairHooks{liveExtentCompared: func(r int, e ids.ExtentID) {
		if e == 3 {
			once.Do(func() { c.ds[2].stop(); close(stopped) })
		}
	}}
	if err := u.Activate(ctxT(t), 1); err != nil {
		t.Fatal(err)
	}
	want := writePattern(t, u, 4)
	first, cancel := u.SubscribeLiveRepair(2, 4)
	defer cancel()
	c.ds[2].start()
	if got := waitFinal(t, first); got[len(got)-1].Phase != reconcile.PhaseError {
		t.Fatalf("interrupted live repair ended %+v", got[len(got)-1])
	}
	<-stopped
	waitState(t, u, 2, engine.ReplicaFaulted)
	second, cancel2 := u.SubscribeLiveRepair(2, 4)
	defer cancel2()
	c.ds[2].start()
	if got := waitFinal(t, second); got[len(got)-1].Phase != reconcile.PhaseDone {
		t.Fatalf("retried live repair ended %+v", got[len(got)-1])
	}
	waitState(t, u, 2, engine.ReplicaActive)
	u.Close()
	c.requireSameReplicas(want)
}

func TestReplaceReplicaWithNewAddress(t *testing.T) {
	c := newCluster(t)
	u := c.open(c.config(), 1)
	want := writePattern(t, u, 6)
	fresh := newDownstairs(t, c.spec) // same UUID and geometry, empty
	old := c.ds[1].addr
	ctx := ctxT(t)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // guest IO carries on during the replacement
		defer wg.Done()
		for i := range 20 {
			if _, err := u.WriteAt(ctx, want[i*testBlockSize:(i+1)*testBlockSize], int64(i)*testBlockSize); err != nil {
				t.Error(err)
			}
		}
	}()
	if err := u.ReplaceReplica(ctx, old, fresh.addr); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	s := u.Status().Replicas[1]
	if s.State != engine.ReplicaActive || s.Target != fresh.addr {
		t.Fatalf("replaced replica %+v", s)
	}
	if st := u.RepairStats(); st.BlocksCopied == 0 {
		t.Fatal("nothing copied to the new replica")
	}
	if err := u.ReplaceReplica(ctx, "127.0.0.1:1", "127.0.0.1:2"); !errors.Is(err, ErrUnknownTarget) {
		t.Fatalf("replacing an unknown target = %v", err)
	}
	if got := readVolume(t, u); !bytes.Equal(got, want) {
		t.Fatal("volume differs after replacement")
	}
	u.Close()
	c.ds[1] = fresh
	c.requireSameReplicas(want)
}

func TestRepairMetrics(t *testing.T) {
	c := newCluster(t)
	baseVolume(t, c)
	c.ds[0].diverge([]uint64{3}, 2, 0, 0, false)
	cfg := c.config()
	set := metrics.NewSet()
	cfg.Metrics = set
	u := c.open(cfg, 2)
	defer u.Close()
	var out strings.Builder
	set.WritePrometheus(&out)
	for _, want := range []string{
		`tern_upstairs_repair_bytes_total{kind="activation",upstairs="` + u.cfg.UpstairsID.String() + `"} 8192`,
		`tern_upstairs_repair_extents_total{kind="activation"`,
		`tern_upstairs_repair_duration_seconds_bucket{kind="activation"`,
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

var _ = context.Background
