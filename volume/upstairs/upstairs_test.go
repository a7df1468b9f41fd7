package upstairs

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/google/uuid"

	"tern/volume/downstairs"
	"tern/volume/extent"
	"tern/volume/upstairs/engine"
	"tern/volume/wire"
)

func TestRandomWritesAndReadsVerified(t *testing.T) {
	c := newCluster(t)
	u := c.open(c.config(), 1)
	ctx := ctxT(t)
	m := &model{data: make([]byte, volumeBytes())}
	const workers = 4
	span := volumeBytes() / workers
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			base := int64(w) * span
			for i := range 60 {
				blocks := 1 + rng.IntN(80) // up to 320 KiB: some cross extents
				off := base + int64(rng.IntN(int(span/testBlockSize)-blocks))*testBlockSize
				p := make([]byte, blocks*testBlockSize)
				if i%3 != 2 {
					FillPattern(p, testBlockSize, uint64(off/testBlockSize), uint64(i))
					if _, err := u.WriteAt(ctx, p, off); err != nil {
						errs <- err
						return
					}
					m.write(p, off)
				} else {
					if _, err := u.ReadAt(ctx, p, off); err != nil {
						errs <- err
						return
					}
					m.check(t, p, off)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if err := u.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	all := make([]byte, volumeBytes())
	if _, err := u.ReadAt(ctx, all, 0); err != nil {
		t.Fatal(err)
	}
	m.check(t, all, 0)
	if err := u.Close(); err != nil {
		t.Fatal(err)
	}
	c.requireSameReplicas(m.data)
}

func TestUnalignedAndOutOfRangeIORefused(t *testing.T) {
	c := newCluster(t)
	u := c.open(c.config(), 1)
	ctx := ctxT(t)
	tests := []struct {
		name string
		len  int
		off  int64
		want error
	}{
		{"short buffer", 100, 0, ErrUnaligned},
		{"odd offset", testBlockSize, 512, ErrUnaligned},
		{"past the end", testBlockSize, volumeBytes(), ErrOutOfRange},
		{"negative", testBlockSize, -testBlockSize, ErrOutOfRange},
	}
	for _, tt := range tests {
		p := make([]byte, tt.len)
		if _, err := u.WriteAt(ctx, p, tt.off); !errors.Is(err, tt.want) {
			t.Errorf("%s: WriteAt = %v, want %v", tt.name, err, tt.want)
		}
		if _, err := u.ReadAt(ctx, p, tt.off); !errors.Is(err, tt.want) {
			t.Errorf("%s: ReadAt = %v, want %v", tt.name, err, tt.want)
		}
	}
}

func TestIOBeforeActivateFails(t *testing.T) {
	c := newCluster(t)
	u, err := New(c.config())
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	if _, err := u.WriteAt(ctxT(t), make([]byte, testBlockSize), 0); !errors.Is(err, ErrNotActive) {
		t.Fatalf("WriteAt before Activate = %v, want ErrNotActive", err)
	}
}

func TestConfigReportsEveryProblem(t *testing.T) {
	_, err := New(Config{Targets: []string{"a:1", "a:1"}, BacklogJobs: -1, ActivationQuorumWait: -1,
		KeepAlivePeriod: 2 * time.Second, IdleTimeout: time.Second})
	if !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("New = %v, want ErrInvalidConfig", err)
	}
	for _, want := range []string{"want 3 addresses", "repeats targets[0]", "tls", "backlog jobs", "activation quorum wait", "keepalive 2s"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

// writePattern writes the seed's pattern over the whole volume in 64 KiB
// IOs and returns the expected bytes.
func writePattern(t testing.TB, u *Upstairs, seed uint64) []byte {
	t.Helper()
	ctx := ctxT(t)
	data := make([]byte, volumeBytes())
	FillPattern(data, testBlockSize, 0, seed)
	for off := int64(0); off < volumeBytes(); off += 64 << 10 {
		if _, err := u.WriteAt(ctx, data[off:off+64<<10], off); err != nil {
			t.Fatal(err)
		}
	}
	return data
}

func TestReplicaLostMidWorkloadIsReplayed(t *testing.T) {
	c := newCluster(t)
	u := c.open(c.config(), 1)
	ctx := ctxT(t)
	m := &model{data: writePattern(t, u, 1)}

	c.ds[2].stop() // the replica dies under load
	p := make([]byte, 16*testBlockSize)
	for i := range 40 {
		off := int64(i%32) * int64(len(p))
		FillPattern(p, testBlockSize, uint64(off/testBlockSize), 100+uint64(i))
		if _, err := u.WriteAt(ctx, p, off); err != nil {
			t.Fatalf("write %d with a replica down: %v", i, err)
		}
		m.write(p, off)
	}
	waitState(t, u, 2, engine.ReplicaOffline)
	if n := u.Status().Replicas[2].OutstandingJobs; n == 0 {
		t.Fatal("offline replica has no backlog")
	}
	all := make([]byte, volumeBytes())
	if _, err := u.ReadAt(ctx, all, 0); err != nil {
		t.Fatal(err)
	}
	m.check(t, all, 0)

	c.ds[2].start() // back on the same address within the backlog
	waitStatus(t, u, "replica 2 active with backlog replayed", func(s Status) bool {
		r := s.Replicas[2]
		if r.State == engine.ReplicaFaulted {
			t.Fatalf("replica 2 faulted instead of replaying: %s", r.LastError)
		}
		return r.State == engine.ReplicaActive && r.OutstandingJobs == 0
	})
	if err := u.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := u.Close(); err != nil {
		t.Fatal(err)
	}
	c.requireSameReplicas(m.data)
}

func TestBacklogOverflowFaultsReplica(t *testing.T) {
	c := newCluster(t)
	cfg := c.config()
	cfg.BacklogJobs = 8
	u := c.open(cfg, 1)
	ctx := ctxT(t)
	c.ds[1].stop()
	p := make([]byte, testBlockSize)
	for i := range 30 {
		if _, err := u.WriteAt(ctx, p, int64(i)*testBlockSize); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
	waitState(t, u, 1, engine.ReplicaFaulted)
	st := u.Status().Replicas[1]
	if st.OutstandingJobs != 0 {
		t.Fatalf("faulted replica keeps %d jobs", st.OutstandingJobs)
	}
	// Why it is faulted (the backlog), and why that began (the lost
	// connection).
	if !strings.Contains(st.FaultReason, "more than the offline backlog allows") || !strings.Contains(st.FaultReason, "first: ") {
		t.Fatalf("fault reason %q: want the overflow and the first reason", st.FaultReason)
	}
	// IO continues on two replicas; the faulted one gets none until live
	// repair brings it back once its downstairs is.
	for i := range 10 {
		if _, err := u.WriteAt(ctx, p, int64(i)*testBlockSize); err != nil {
			t.Fatalf("write with a faulted replica: %v", err)
		}
	}
	if st := u.Status().Replicas[1]; st.State != engine.ReplicaFaulted || st.OutstandingJobs != 0 {
		t.Fatalf("faulted replica = %+v, want faulted with no jobs", st)
	}
	c.ds[1].start()
	waitState(t, u, 1, engine.ReplicaActive)
	if st := u.Status().Replicas[1]; st.FaultReason != "" || !st.FaultedAt.IsZero() {
		t.Fatalf("active replica keeps fault reason %q (at %v)", st.FaultReason, st.FaultedAt)
	}
	if err := u.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	u.Close()
	c.requireSameReplicas(nil)
}

func TestHigherGenerationFencesOlderUpstairs(t *testing.T) {
	c := newCluster(t)
	old := c.open(c.config(), 1)
	ctx := ctxT(t)
	p := make([]byte, testBlockSize)
	if _, err := old.WriteAt(ctx, p, 0); err != nil {
		t.Fatal(err)
	}
	newer := c.open(c.config(), 2)
	waitStatus(t, old, "old upstairs fenced", func(s Status) bool { return errors.Is(s.Err, ErrFenced) })
	if _, err := old.WriteAt(ctx, p, 0); !errors.Is(err, ErrFenced) {
		t.Fatalf("old WriteAt = %v, want ErrFenced", err)
	}
	if _, err := old.ReadAt(ctx, p, 0); !errors.Is(err, ErrFenced) {
		t.Fatalf("old ReadAt = %v, want ErrFenced", err)
	}
	if err := old.Flush(ctx); !errors.Is(err, ErrFenced) {
		t.Fatalf("old Flush = %v, want ErrFenced", err)
	}
	if _, err := newer.WriteAt(ctx, p, 0); err != nil {
		t.Fatalf("new WriteAt: %v", err)
	}
	// A lower generation cannot take the region back.
	u, err := New(c.config())
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	if err := u.Activate(ctx, 1); !errors.Is(err, ErrGenTooLow) {
		t.Fatalf("Activate(1) after 2 = %v, want ErrGenTooLow", err)
	}
}

func TestCorruptBlockIsServedFromPeerAndRewritten(t *testing.T) {
	c := newCluster(t)
	u := c.open(c.config(), 1)
	want := writePattern(t, u, 3)
	if err := u.Flush(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	u.Close()
	// Damage block 5 of replica 0 on disk, behind the downstairs' back.
	c.ds[0].stop()
	f, err := os.OpenFile(filepath.Join(c.ds[0].dir, "000000.ext"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("corrupted!"), 5*testBlockSize+100); err != nil {
		t.Fatal(err)
	}
	f.Close()
	c.ds[0].start()

	u2 := c.open(c.config(), 2)
	ctx := ctxT(t)
	p := make([]byte, 8*testBlockSize)
	// Idle replicas tie on load and the first wins, so replica 0 serves.
	if _, err := u2.ReadAt(ctx, p, 0); err != nil {
		t.Fatal(err)
	}
	if string(p) != string(want[:len(p)]) {
		t.Fatal("read returned the corrupt block")
	}
	if err := u2.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	u2.Close()
	c.requireSameReplicas(want) // the bad block was rewritten from a peer
}

func TestMismatchedReplicasRefusedByName(t *testing.T) {
	tests := []struct {
		name string
		spec func(extent.Spec) extent.Spec
		want string
	}{
		{"uuid", func(s extent.Spec) extent.Spec { s.UUID = uuid.New(); return s }, "region uuid"},
		{"geometry", func(s extent.Spec) extent.Spec {
			return extent.NewSpec(testBlockSize, testExtentBlocks, testExtentCount+1)
		}, "extent count"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newCluster(t)
			other := tt.spec(c.spec)
			if tt.name == "geometry" {
				other.UUID = c.spec.UUID
			}
			c.ds[2].stop()
			dir := t.TempDir()
			if err := downstairs.Create(dir, other); err != nil {
				t.Fatal(err)
			}
			c.ds[2].dir = dir
			c.ds[2].start()
			u, err := New(c.config())
			if err != nil {
				t.Fatal(err)
			}
			defer u.Close()
			err = u.Activate(ctxT(t), 1)
			if !errors.Is(err, ErrRegionMismatch) {
				t.Fatalf("Activate = %v, want ErrRegionMismatch", err)
			}
			for _, s := range []string{"replica 2", c.ds[2].addr, tt.want} {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not name %q", err, s)
				}
			}
		})
	}
}

func TestCloseLeavesNoGoroutines(t *testing.T) {
	c := newCluster(t)
	u := c.open(c.config(), 1)
	ctx := ctxT(t)
	writePattern(t, u, 9)
	// Leave IO in flight and a replica reconnecting when Close comes.
	c.ds[1].stop()
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			p := make([]byte, 64<<10)
			for {
				if _, err := u.WriteAt(ctx, p, int64(i)*int64(len(p))); err != nil {
					return
				}
			}
		})
	}
	waitState(t, u, 1, engine.ReplicaOffline)
	if err := u.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if _, err := u.WriteAt(ctx, make([]byte, testBlockSize), 0); !errors.Is(err, ErrClosed) {
		t.Fatalf("WriteAt after Close = %v, want ErrClosed", err)
	}
	// Close waited for every goroutine of its own; what a dial started
	// (quic-go's, the transport's socket reaper) ends with the connection.
	deadline := time.Now().Add(testTimeout)
	for g := ownGoroutines(); len(g) > 0; g = ownGoroutines() {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines survived Close:\n%s", len(g), strings.Join(g, "\n\n"))
		}
		runtime.Gosched()
	}
}

func TestCallerChangingBufferInFlightKeepsReplicasIdentical(t *testing.T) {
	if raceEnabled {
		t.Skip("the guest's scribbling is a data race by design; run without -race")
	}
	c := newCluster(t)
	u := c.open(c.config(), 1)
	ctx := ctxT(t)
	p := make([]byte, 256<<10)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { // a guest scribbling on its buffer during writes
		for i := byte(0); ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			for j := 0; j < len(p); j += 512 {
				p[j] = i
			}
		}
	})
	for i := range 40 {
		if _, err := u.WriteAt(ctx, p, int64(i%8)*int64(len(p))); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	if err := u.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	u.Close()
	c.requireSameReplicas(nil)
}

func TestCancelledReadReleasesCaller(t *testing.T) {
	c := newCluster(t)
	u := c.open(c.config(), 1)
	ctx, cancel := context.WithCancel(ctxT(t))
	cancel()
	p := make([]byte, testBlockSize)
	if _, err := u.ReadAt(ctx, p, 0); !errors.Is(err, context.Canceled) {
		t.Fatalf("ReadAt with a cancelled context = %v", err)
	}
	if _, err := u.ReadAt(ctxT(t), p, 0); err != nil {
		t.Fatalf("ReadAt after a cancelled one: %v", err)
	}
}

func TestActivationGoesAheadWithTwoAfterQuorumWait(t *testing.T) {
	c := newCluster(t)
	c.ds[1].stop()
	cfg := c.config()
	cfg.ActivationQuorumWait = 100 * time.Millisecond
	u := c.open(cfg, 1)
	if st := u.Status().Replicas[1].State; st != engine.ReplicaFaulted {
		t.Fatalf("absent replica is %v, want faulted (it needs repair)", st)
	}
	want := writePattern(t, u, 5)
	got := make([]byte, len(want))
	if _, err := u.ReadAt(ctxT(t), got, 0); err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Fatal("read back differs")
	}
	// The late replica rejoins by live repair, and holds what was written.
	c.ds[1].start()
	waitState(t, u, 1, engine.ReplicaActive)
	u.Close()
	c.requireSameReplicas(want)
}

func TestActivationWaitsForTwo(t *testing.T) {
	c := newCluster(t)
	c.ds[1].stop()
	c.ds[2].stop()
	cfg := c.config()
	cfg.ActivationQuorumWait = 50 * time.Millisecond
	u, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if err := u.Activate(ctx, 1); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Activate with one replica = %v, want it to wait for a second until the deadline", err)
	}
}

func TestMetricsCountIO(t *testing.T) {
	c := newCluster(t)
	cfg := c.config()
	set := metrics.NewSet()
	cfg.Metrics = set
	u := c.open(cfg, 1)
	ctx := ctxT(t)
	p := make([]byte, 2*testBlockSize)
	u.WriteAt(ctx, p, 0)
	u.ReadAt(ctx, p, 0)
	u.Flush(ctx)
	var out strings.Builder
	set.WritePrometheus(&out)
	for _, want := range []string{
		`tern_upstairs_io_total{kind="write"`,
		`tern_upstairs_io_bytes_total{kind="read"`,
		`tern_upstairs_io_duration_seconds_bucket{kind="flush"`,
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

func TestWriteWithoutQuorumHonoursContext(t *testing.T) {
	c := newCluster(t)
	u := c.open(c.config(), 1)
	c.ds[1].stop()
	c.ds[2].stop()
	waitState(t, u, 1, engine.ReplicaOffline) // their downstairs stay down
	waitState(t, u, 2, engine.ReplicaOffline)
	// Offline replicas still take the write into their backlog, so it
	// waits for them rather than failing; the caller's deadline ends it.
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	p := make([]byte, 4*testBlockSize)
	if _, err := u.WriteAt(ctx, p, 0); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WriteAt without quorum = %v, want DeadlineExceeded", err)
	}
	// The buffer is the caller's again: the backlog holds a private copy.
	for i := range p {
		p[i] = 0xff
	}
	if n := u.Status().Replicas[1].OutstandingJobs; n != 1 {
		t.Fatalf("offline replica owes %d jobs, want the abandoned write", n)
	}
	// Reads are served by the one active replica.
	if _, err := u.ReadAt(ctxT(t), p, 0); err != nil {
		t.Fatal(err)
	}
}

// TestRepairCallsOnHealthyReplica drives the call seam repair uses: a
// healthy replica answers repair calls alongside guest IO, a faulted one
// refuses them.
func TestRepairCallsOnHealthyReplica(t *testing.T) {
	c := newCluster(t)
	c.ds[2].stop()
	cfg := c.config()
	cfg.ActivationQuorumWait = 50 * time.Millisecond
	u := c.open(cfg, 1)
	ctx := ctxT(t)
	want := writePattern(t, u, 11)

	m, err := u.callReplica(ctx, 0, &wire.ExtentHashesRequest{Extent: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if h, ok := m.(*wire.ExtentHashes); !ok || len(h.Hashes) != testExtentBlocks {
		t.Fatalf("ExtentHashes reply = %#v", m)
	}
	data := make([]byte, 2*testBlockSize)
	m, err = u.callReplica(ctx, 0, &wire.RepairRead{Extent: 1, Blocks: []uint32{3, 4}}, data)
	if err != nil {
		t.Fatal(err)
	}
	rd, ok := m.(*wire.RepairData)
	if !ok || string(rd.Data) != string(want[(testExtentBlocks+3)*testBlockSize:(testExtentBlocks+5)*testBlockSize]) {
		t.Fatalf("RepairData reply = %T, wrong data", m)
	}
	if &rd.Data[0] != &data[0] {
		t.Fatal("repair data did not land in the caller's buffer")
	}
	if _, err := u.callReplica(ctx, 2, &wire.ExtentHashesRequest{Extent: 0}, nil); !errors.Is(err, ErrNoSession) {
		t.Fatalf("call to a faulted replica = %v, want ErrNoSession", err)
	}
}
