package sim

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

var (
	flagSeeds = flag.Int("seeds", 0, "run this many seeds (0: the fixed CI budget)")
	flagSeed  = flag.Int64("seed", -1, "run only this seed")
	flagFirst = flag.Int64("first", 0, "first seed of a -seeds campaign")
	flagSkip  = flag.String("skip", "", "fault numbers not to inject, as 3,7-12 (replays a shrunk run)")
	flagSteps = flag.Int("steps", 0, "ticks of the faulty phase (0: the default)")
	flagWhole = flag.Bool("whole-volume-crash", false, "with crashes of the whole volume (TestDumpTrace; TestSimulationWholeVolumeCrash always has them)")
)

// ciSeeds is the fixed budget a plain `go test ./volume/sim` runs.
const ciSeeds = 20

// seedsToRun returns the seeds the flags ask for.
func seedsToRun() []uint64 {
	if *flagSeed >= 0 {
		return []uint64{uint64(*flagSeed)}
	}
	n := *flagSeeds
	if n <= 0 {
		n = ciSeeds
	}
	out := make([]uint64, n)
	for i := range out {
		out[i] = uint64(*flagFirst) + uint64(i)
	}
	return out
}

func configFor(t *testing.T, seed uint64) Config {
	cfg := DefaultConfig(seed)
	if *flagWhole {
		cfg.Faults = WholeVolumeCrashProbabilities()
	}
	if *flagSteps > 0 {
		cfg.Steps = *flagSteps
	}
	if *flagSkip != "" {
		cfg.Skip = map[int]bool{}
		for _, f := range strings.Split(*flagSkip, ",") {
			lo, hi, isRange := strings.Cut(f, "-")
			a, err := strconv.Atoi(lo)
			b := a
			if err == nil && isRange {
				b, err = strconv.Atoi(hi)
			}
			if err != nil {
				t.Fatalf("parse -skip: %v", err)
			}
			for n := a; n <= b; n++ {
				cfg.Skip[n] = true
			}
		}
	}
	return cfg
}

// TestSimulation runs the seeds the flags ask for; each logs its summary
// line, and a failing one its shrunk fault schedule and event trace.
func TestSimulation(t *testing.T) {
	for _, seed := range seedsToRun() {
		cfg := configFor(t, seed)
		res := Run(cfg)
		t.Log(res.Summary())
		if len(res.Violations) == 0 {
			continue
		}
		t.Errorf("seed %d: %s", seed, res.Violations[0])
		reportFailure(t, cfg, res)
	}
}

// TestSimulationWholeVolumeCrash runs the seeds the flags ask for with
// crashes of every downstairs at once (faultCrashAll): no replica is left
// Active to repair the others from, so the upstairs reconciles them in
// place (restart reconciliation) and resumes. The floor of a read falls
// back to the durable writes at each such crash (oracle.crashAll).
func TestSimulationWholeVolumeCrash(t *testing.T) {
	restarts := 0
	for _, seed := range seedsToRun() {
		cfg := configFor(t, seed)
		cfg.Faults = WholeVolumeCrashProbabilities()
		res := Run(cfg)
		t.Log(res.Summary())
		restarts += res.Faults[faultCrashAll]
		if len(res.Violations) == 0 {
			continue
		}
		t.Errorf("seed %d: %s", seed, res.Violations[0])
		reportFailure(t, cfg, res)
	}
	t.Logf("%d whole-volume crashes", restarts)
	if restarts == 0 && *flagSeed < 0 {
		t.Error("no seed crashed the whole volume: the test covers nothing")
	}
}

// reportFailure shrinks a failing run's fault schedule and prints the
// shortest failing trace it found, with the command that replays it.
func reportFailure(t *testing.T, cfg Config, res Result) {
	t.Helper()
	small, shrunk := Shrink(cfg, res, 48)
	small.KeepTrace = true
	full := Run(small)
	dir := t.TempDir()
	if d := os.Getenv("SIM_TRACE_DIR"); d != "" {
		dir = d
	}
	path := filepath.Join(dir, fmt.Sprintf("sim-seed-%d.trace", cfg.Seed))
	_ = os.WriteFile(path, []byte(strings.Join(full.Trace, "\n")+"\n"), 0o644)
	t.Logf("seed %d fails; replay: go test ./volume/sim -run TestSimulation -v -seed %d", cfg.Seed, cfg.Seed)
	t.Logf("shortest failing run found: %d of %d faults, %d of %d ticks: go test ./volume/sim -run TestSimulation -v -seed %d -steps %d -skip %s",
		shrunk.Faults.Total(), res.Faults.Total(), small.Steps, cfg.Steps, cfg.Seed, small.Steps, skipList(small.Skip))
	t.Logf("its violation: %s", firstOr(full.Violations, "(did not reproduce)"))
	t.Logf("its event trace (%d lines, also in %s):", len(full.Trace), path)
	for _, l := range full.Trace {
		t.Log("  " + l)
	}
}

func firstOr(s []string, def string) string {
	if len(s) == 0 {
		return def
	}
	return s[0]
}

func skipList(skip map[int]bool) string {
	var ns []int
	for n := range skip {
		ns = append(ns, n)
	}
	slices.Sort(ns)
	var parts []string
	for i := 0; i < len(ns); {
		j := i
		for j+1 < len(ns) && ns[j+1] == ns[j]+1 {
			j++
		}
		if j > i {
			parts = append(parts, fmt.Sprintf("%d-%d", ns[i], ns[j]))
		} else {
			parts = append(parts, strconv.Itoa(ns[i]))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}

// TestReplayIsExact proves a seed replays exactly: two runs of one seed
// produce the same event trace.
func TestReplayIsExact(t *testing.T) {
	for _, seed := range []uint64{1, 7} {
		cfg := DefaultConfig(seed)
		cfg.Steps = 1500
		cfg.KeepTrace = true
		a, b := Run(cfg), Run(cfg)
		if a.TraceHash != b.TraceHash || !slices.Equal(a.Trace, b.Trace) {
			i := 0
			for i < min(len(a.Trace), len(b.Trace)) && a.Trace[i] == b.Trace[i] {
				i++
			}
			t.Fatalf("seed %d: traces differ at line %d of %d/%d", seed, i, len(a.Trace), len(b.Trace))
		}
		if a.Events == 0 || a.Faults.Total() == 0 {
			t.Fatalf("seed %d: %s: nothing happened", seed, a.Summary())
		}
	}
}

// TestARunThatDoesNothingFails: with no faulty phase the workload submits
// nothing, only the final flush runs, and the run must fail rather than
// pass for checking nothing; a normal run acknowledges writes and flushes.
func TestARunThatDoesNothingFails(t *testing.T) {
	cfg := DefaultConfig(3)
	cfg.Steps = 0
	r := Run(cfg)
	if len(r.Violations) == 0 || !isNoProgress(r.Violations[0]) {
		t.Fatalf("an idle run: violations %q; want %q", r.Violations, noProgress)
	}
	cfg = DefaultConfig(3)
	cfg.Steps = 300
	r = Run(cfg)
	if len(r.Violations) > 0 || r.WritesAcked == 0 || r.FlushesAcked == 0 {
		t.Fatalf("a 300-tick run: %d writes and %d flushes acknowledged, violations %q", r.WritesAcked, r.FlushesAcked, r.Violations)
	}
}
