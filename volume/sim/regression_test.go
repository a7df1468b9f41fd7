package sim

import (
	"flag"
	"testing"

	"tern/volume/internal/fixes"
)

// mutationSeedBound bounds the seeds a mutation must be caught within:
// each kept seed below is under it, so a fix undone in the production code
// is found by a campaign of that many seeds.
const mutationSeedBound = 4000

// mutations undo, one at a time, past fixes of the production code the
// simulator drives (volume/internal/fixes: engine.Engine.Rejoin, FlushedOn,
// LiveRepairSource, reconcile.NewestFirst, MendSourceAgain), each with
// seeds of its campaign that catch it. Every seed must fail with the fix
// undone (or it no longer covers the bug) and pass as the code stands.
// docs/reliability.md lists them.
var mutations = []struct {
	fix   fixes.Fix
	name  string
	seeds []uint64
	// wholeVolume runs the seeds with crashes of the whole volume
	// (WholeVolumeCrashProbabilities).
	wholeVolume bool
}{
	{fix: fixes.RepairLostWrites, name: "restarted replica replayed over lost writes", seeds: []uint64{2, 7, 9}},
	{fix: fixes.RepairLostWrites, name: "every replica restarted, replayed over lost writes", seeds: []uint64{1, 13}, wholeVolume: true},
	{fix: fixes.HoldWithoutSource, name: "every replica restarted, live-repaired with no source: the volume stalls", seeds: []uint64{1, 4}, wholeVolume: true},
	{fix: fixes.AvoidBadLiveSource, name: "live repair stuck on a source with a flipped bit", seeds: []uint64{97, 110}},
	{fix: fixes.MendCleanSource, name: "takeover activation fails on a clean source with a flipped bit", seeds: []uint64{135, 379}},
	{fix: fixes.FlushedOnRejoin, name: "a cut-short replay regresses a replica below its flushed state", seeds: []uint64{3578}},
	{fix: fixes.NewestDonorFirst, name: "a damaged only copy is replaced from a stale replica, not the newest", seeds: []uint64{879}},
	{fix: fixes.MendSourceTwice, name: "takeover activation fails on a clean source damaged again after its mend", seeds: []uint64{1495}, wholeVolume: true},
}

func mutationConfig(seed uint64, wholeVolume bool) Config {
	cfg := DefaultConfig(seed)
	if wholeVolume {
		cfg.Faults = WholeVolumeCrashProbabilities()
	}
	return cfg
}

// TestRegressionSeeds proves the simulator catches each past fix
// undone in the production code, on the kept seeds, and that those seeds
// pass with the fix in place.
func TestRegressionSeeds(t *testing.T) {
	covered := map[fixes.Fix]bool{}
	for _, m := range mutations {
		covered[m.fix] = true
		for _, seed := range m.seeds {
			if seed >= mutationSeedBound {
				t.Errorf("%s: seed %d is past the bound %d", m.name, seed, mutationSeedBound)
			}
			cfg := mutationConfig(seed, m.wholeVolume)
			if r := Run(cfg); len(r.Violations) > 0 {
				t.Errorf("%s: seed %d fails as the code stands: %s", m.name, seed, r.Violations[0])
			}
			restore := fixes.Undo(m.fix)
			r := Run(cfg)
			restore()
			if len(r.Violations) == 0 {
				t.Errorf("%s: seed %d passes with %v undone: it no longer covers the bug (refresh with -find-regressions)", m.name, seed, m.fix)
			} else {
				t.Logf("%s: %v undone, seed %d: %s", m.name, m.fix, seed, r.Violations[0])
			}
		}
	}
	for _, f := range fixes.All() {
		if !covered[f] {
			t.Errorf("fix %v has no seed that catches it undone", f)
		}
	}
}

var flagFindRegressions = flag.Int("find-regressions", 0, "list seeds below N that fail with each fix undone (to refresh mutations after the simulation changes)")

// TestFindRegressionSeeds lists, for each kept bug, seeds that fail with
// its fix undone: the simulation's own changes shift every run, so the
// kept seeds are refreshed from this list when they stop covering a bug.
func TestFindRegressionSeeds(t *testing.T) {
	if *flagFindRegressions == 0 {
		t.Skip("run with -find-regressions N")
	}
	for _, m := range mutations {
		var found []uint64
		for seed := range uint64(*flagFindRegressions) {
			cfg := mutationConfig(seed, m.wholeVolume)
			restore := fixes.Undo(m.fix)
			r := Run(cfg)
			restore()
			if len(r.Violations) > 0 && len(Run(cfg).Violations) == 0 {
				found = append(found, seed)
				if len(found) == 5 {
					break
				}
			}
		}
		t.Logf("%s (%v): %v", m.name, m.fix, found)
	}
}

// TestLostIsCountedAfterAViolation: a run stopped by a violation before
// its final comparison still counts the blocks it lost. With the newest
// donor fix undone, the kept seed stops at a read that returns an older
// value than a flushed write, which no replica holds any more.
func TestLostIsCountedAfterAViolation(t *testing.T) {
	for _, m := range mutations {
		if m.fix != fixes.NewestDonorFirst {
			continue
		}
		lost := 0
		for _, seed := range m.seeds {
			restore := fixes.Undo(m.fix)
			r := Run(mutationConfig(seed, m.wholeVolume))
			restore()
			t.Logf("seed %d: lost %d, violations %q", seed, r.Lost, r.Violations)
			lost += r.Lost
		}
		if lost == 0 {
			t.Errorf("%s: no lost block counted on seeds %v", m.name, m.seeds)
		}
	}
}
