package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"tern/instance/apiv1"
	"tern/internal/kvmhost"
	"tern/vmm/kvm"
	"tern/volume/ids"
	"tern/volume/volumetest"
)

// StartOptions configure RunStart.
type StartOptions struct {
	// Tern is the tern binary whose `vmm serve` processes are measured.
	Tern string
	// Runs is the number of ensures of each kind per phase (default 50).
	Runs int
	// Concurrency is the number of vmm processes of the concurrent phase
	// (default 8); they share Runs between them.
	Concurrency int
	// SlowDiverge is the fraction of the slow volume's blocks (256 MiB,
	// 4 KiB blocks) that its replicas 0 and 1 hold at a later flush than
	// replica 2, which activation must reconcile (default 1: every
	// block, several seconds here).
	SlowDiverge float64
	// Dir holds the regions, disks and logs; empty means a temporary
	// directory.
	Dir string
	// Progress, when set, gets a line as each step starts.
	Progress io.Writer
}

// StartPhase is one phase's figures, in milliseconds.
type StartPhase struct {
	VMMs int `json:"vmms"`
	// Ensures of an instance with a file-backed disk: until the 201, and
	// until the monitor publishes running (run requested right after).
	EnsureReturnP50    float64 `json:"ensure_return_ms_p50"`
	EnsureReturnP99    float64 `json:"ensure_return_ms_p99"`
	EnsureToRunningP50 float64 `json:"ensure_to_running_ms_p50"`
	EnsureToRunningP99 float64 `json:"ensure_to_running_ms_p99"`
	// Ensures of an instance whose volume needs a reconciliation of
	// several seconds before it can run: until the 201.
	EnsureReturnSlowP50 float64 `json:"ensure_return_slow_activation_ms_p50"`
	EnsureReturnSlowP99 float64 `json:"ensure_return_slow_activation_ms_p99"`
	// GET /healthz round trips, the floor, each timed just before an
	// ensure.
	HealthzP50 float64 `json:"healthz_ms_p50"`
	HealthzP99 float64 `json:"healthz_ms_p99"`
	// SlowActivation is, once per phase, the slow volume's ensure→running:
	// how long the reconciliation the ensures did not wait for takes.
	SlowActivation float64 `json:"slow_activation_ensure_to_running_ms"`
	// SlowActivationBytes is what that reconciliation copied.
	SlowActivationBytes uint64 `json:"slow_activation_bytes_repaired"`
	// EnsureRetries counts ensures refused with instance_exists just after
	// the last instance was seen destroyed, repeated and not timed. The
	// server accepts an ensure once destroyed is observable, so it should
	// be 0: anything else is a regression.
	EnsureRetries int `json:"ensure_retries_after_destroyed"`
	// Ratios the targets bound.
	EnsureToHealthz float64 `json:"ensure_return_p99_over_healthz_p99"`
	SlowToFast      float64 `json:"ensure_return_slow_p99_over_fast_p99"`
}

// StartReport is the JSON `tern bench start --json` writes. The first
// five keys are a contract and are the sequential phase's.
type StartReport struct {
	EnsureReturnP50     float64    `json:"ensure_return_ms_p50"`
	EnsureReturnP99     float64    `json:"ensure_return_ms_p99"`
	EnsureReturnSlowP99 float64    `json:"ensure_return_slow_activation_ms_p99"`
	EnsureToRunningP50  float64    `json:"ensure_to_running_ms_p50"`
	HealthzP99          float64    `json:"healthz_ms_p99"`
	Runs                int        `json:"runs"`
	Sequential          StartPhase `json:"sequential"`
	Concurrent          StartPhase `json:"concurrent"`
}

// Targets of the start benchmark.
const (
	// TargetEnsureOverHealthz bounds ensure-return p99 / healthz p99.
	TargetEnsureOverHealthz = 3.0
	// TargetSlowOverFast bounds ensure-return p99 with a slow activation
	// over that with none.
	TargetSlowOverFast = 1.5
)

// startWorker is one vmm with its own file disk and slow volume.
type startWorker struct {
	vmm     *vmmProc
	disk    string
	cluster *volumetest.Cluster
	// blocks are the slow volume's diverged blocks.
	blocks []uint64
	// gen is the slow volume's last activation generation.
	gen ids.Generation
	// round counts re-divergences of the slow volume.
	round uint64
	// ids numbers the instances.
	ids int
	// ensureRetried counts ensures refused with instance_exists after the
	// last instance was seen destroyed (see ensure); it should stay 0.
	ensureRetried int
}

// startSamples are one phase's measurements.
type startSamples struct {
	mu                                      sync.Mutex
	ensureReturn, ensureRunning, ensureSlow []time.Duration // guarded by mu
	healthz                                 []time.Duration // guarded by mu
}

func (s *startSamples) add(dst *[]time.Duration, d time.Duration) {
	s.mu.Lock()
	*dst = append(*dst, d)
	s.mu.Unlock()
}

// RunStart measures ensure latency on real `tern vmm serve` processes:
// first one vmm, then opts.Concurrency at once. It refuses to run inside
// the emulated test host, and needs /dev/kvm.
func RunStart(ctx context.Context, opts StartOptions) (*StartReport, error) {
	if err := kvmhost.RefuseBenchmark(); err != nil {
		return nil, err
	}
	if err := kvm.Probe(); err != nil {
		return nil, fmt.Errorf("measuring instance start: needs a usable /dev/kvm: %w", err)
	}
	if opts.Tern == "" {
		return nil, errors.New("measuring instance start: no tern binary")
	}
	if opts.Runs <= 0 {
		opts.Runs = 50
	}
	if opts.Concurrency <= 0 {
		opts.Concurrency = 8
	}
	if opts.SlowDiverge <= 0 || opts.SlowDiverge > 1 {
		opts.SlowDiverge = 1
	}
	dir, removeDir, err := workDir(opts.Dir, "tern-bench-start")
	if err != nil {
		return nil, err
	}
	defer removeDir()
	say := sayer(opts.Progress)

	var workers []*startWorker
	defer func() {
		for _, w := range workers {
			w.close()
		}
	}()
	for i := range opts.Concurrency {
		say("setting up vmm %d of %d: a file disk, and a volume whose replicas diverge on %.0f%% of 256 MiB", i+1, opts.Concurrency, opts.SlowDiverge*100)
		w, err := newStartWorker(filepath.Join(dir, fmt.Sprintf("vmm%d", i)), opts)
		if err != nil {
			return nil, err
		}
		workers = append(workers, w)
	}
	rep := &StartReport{Runs: opts.Runs}
	say("sequential: %d runs on one vmm", opts.Runs)
	if rep.Sequential, err = runStartPhase(ctx, workers[:1], opts, say); err != nil {
		return nil, err
	}
	say("concurrent: %d runs over %d vmms at once", opts.Runs, opts.Concurrency)
	if rep.Concurrent, err = runStartPhase(ctx, workers, opts, say); err != nil {
		return nil, err
	}
	s := rep.Sequential
	rep.EnsureReturnP50, rep.EnsureReturnP99, rep.EnsureReturnSlowP99 = s.EnsureReturnP50, s.EnsureReturnP99, s.EnsureReturnSlowP99
	rep.EnsureToRunningP50, rep.HealthzP99 = s.EnsureToRunningP50, s.HealthzP99
	return rep, nil
}

// runStartPhase runs opts.Runs file and slow ensures shared over
// workers, all at once, then one full slow activation per worker.
func runStartPhase(ctx context.Context, workers []*startWorker, opts StartOptions, say func(string, ...any)) (StartPhase, error) {
	var samples startSamples
	retriesBefore := retries(workers)
	perWorker := (opts.Runs + len(workers) - 1) / len(workers)
	errs := make([]error, len(workers))
	activations := make([]time.Duration, len(workers))
	repaired := make([]uint64, len(workers))
	var wg sync.WaitGroup
	for i, w := range workers {
		wg.Go(func() {
			for range perWorker {
				if err := w.runFile(ctx, &samples); err != nil {
					errs[i] = err
					return
				}
				if err := w.runSlowEnsure(ctx, &samples); err != nil {
					errs[i] = err
					return
				}
			}
			activations[i], repaired[i], errs[i] = w.runSlowActivation(ctx)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return StartPhase{}, err
	}
	p := StartPhase{
		VMMs:                len(workers),
		EnsureReturnP50:     percentileMs(samples.ensureReturn, 0.50),
		EnsureReturnP99:     percentileMs(samples.ensureReturn, 0.99),
		EnsureToRunningP50:  percentileMs(samples.ensureRunning, 0.50),
		EnsureToRunningP99:  percentileMs(samples.ensureRunning, 0.99),
		EnsureReturnSlowP50: percentileMs(samples.ensureSlow, 0.50),
		EnsureReturnSlowP99: percentileMs(samples.ensureSlow, 0.99),
		HealthzP50:          percentileMs(samples.healthz, 0.50),
		HealthzP99:          percentileMs(samples.healthz, 0.99),
		SlowActivation:      percentileMs(activations, 0.50),
		SlowActivationBytes: slices.Min(repaired),
		EnsureRetries:       retries(workers) - retriesBefore,
	}
	p.EnsureToHealthz = p.EnsureReturnP99 / p.HealthzP99
	p.SlowToFast = p.EnsureReturnSlowP99 / p.EnsureReturnP99
	say("  ensure %.2f ms p99 (healthz %.2f ms p99), slow-activation ensure %.2f ms p99, ensure→running %.1f ms p50, slow activation %.0f ms",
		p.EnsureReturnP99, p.HealthzP99, p.EnsureReturnSlowP99, p.EnsureToRunningP50, p.SlowActivation)
	return p, nil
}

// retries sums the workers' ensure retries.
func retries(workers []*startWorker) int {
	n := 0
	for _, w := range workers {
		n += w.ensureRetried
	}
	return n
}

// percentileMs is the q-quantile of ds (nearest rank) in milliseconds.
func percentileMs(ds []time.Duration, q float64) float64 {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := max(0, int(math.Ceil(q*float64(len(s))))-1)
	return float64(s[i]) / float64(time.Millisecond)
}

// WriteTable prints the report for people, each figure beside its target.
func (r *StartReport) WriteTable(w io.Writer) {
	fmt.Fprintf(w, "%d runs of each kind per phase; milliseconds\n", r.Runs)
	fmt.Fprintf(w, "%-12s %5s %13s %13s %13s %13s %13s %12s %12s %10s\n", "phase", "vmms",
		"ensure p50", "ensure p99", "slow ens p50", "slow ens p99", "→running p50", "healthz p50", "healthz p99", "slow act")
	for _, p := range []struct {
		name string
		ph   StartPhase
	}{{"sequential", r.Sequential}, {"concurrent", r.Concurrent}} {
		ph := p.ph
		fmt.Fprintf(w, "%-12s %5d %13.2f %13.2f %13.2f %13.2f %13.1f %12.2f %12.2f %10.0f\n", p.name, ph.VMMs,
			ph.EnsureReturnP50, ph.EnsureReturnP99, ph.EnsureReturnSlowP50, ph.EnsureReturnSlowP99, ph.EnsureToRunningP50,
			ph.HealthzP50, ph.HealthzP99, ph.SlowActivation)
	}
	for _, p := range []struct {
		name string
		ph   StartPhase
	}{{"sequential", r.Sequential}, {"concurrent", r.Concurrent}} {
		fmt.Fprintf(w, "%s: ensure p99 / healthz p99 = %.2f (target ≤ %.1f %s); slow / fast ensure p99 = %.2f (target ≤ %.1f %s)\n",
			p.name, p.ph.EnsureToHealthz, TargetEnsureOverHealthz, met(p.ph.EnsureToHealthz <= TargetEnsureOverHealthz),
			p.ph.SlowToFast, TargetSlowOverFast, met(p.ph.SlowToFast <= TargetSlowOverFast))
	}
}

func met(ok bool) string {
	if ok {
		return "met"
	}
	return "missed"
}

// spec returns the benchmark's instance: the demo guest (it stays
// running) on disk.
func startSpec(id string, disk apiv1.DiskSpec) apiv1.Spec {
	return apiv1.Spec{ID: id, VCPUs: 1, MemoryMiB: 64,
		Guest: apiv1.GuestSpec{Kind: apiv1.GuestELF, Path: "demo"},
		Disks: []apiv1.DiskSpec{disk}, Init: apiv1.InitSpec{Method: apiv1.InitSpecMethod}}
}
