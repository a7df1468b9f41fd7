package sim

import (
	"flag"
	"testing"
)

// regressions are seeds that found bugs in the real code, each run with
// the fix undone (it must still fail, or the seed no longer covers the
// bug) and as the code stands (it must pass).
var regressions = []struct {
	name  string
	seeds []uint64
	undo  func(*Config)
	fix   string // the commit subject of the fix
	// wholeVolume runs the seeds with crashes of the whole volume
	// (WholeVolumeCrashProbabilities).
	wholeVolume bool
}{
	{
		name:  "restarted replica replayed over lost writes",
		seeds: []uint64{2, 7, 9, 17},
		undo:  func(c *Config) { c.legacyRejoin = true },
		fix:   "volume/upstairs: a replica that may have lost unflushed writes is repaired, never replayed",
	},
	{
		name:        "every replica restarted, replayed over lost writes",
		seeds:       []uint64{1, 9, 13},
		undo:        func(c *Config) { c.legacyRejoin = true },
		fix:         "volume/upstairs: a replica that may have lost unflushed writes is repaired, never replayed",
		wholeVolume: true,
	},
	{
		name:        "every replica restarted, live-repaired with no source: the volume stalls",
		seeds:       []uint64{0, 1, 4},
		undo:        func(c *Config) { c.legacyRepairNoSource = true },
		fix:         "volume/upstairs: when no replica is Active the held replicas reconcile as at activation",
		wholeVolume: true,
	},
	{
		name:  "live repair stuck on a source with a flipped bit",
		seeds: []uint64{110, 138, 143},
		undo:  func(c *Config) { c.legacySourceChoice = true },
		fix:   "volume/upstairs: live repair copies from another source after one served bad data",
	},
	{
		name:  "takeover activation fails on a clean source with a flipped bit",
		seeds: []uint64{135, 379},
		undo:  func(c *Config) { c.legacyActivationSource = true },
		fix:   "volume/upstairs: activation repair mends a clean source's silently damaged blocks from its peers",
	},
	{
		name:  "a cut-short replay regresses a replica below its flushed state",
		seeds: []uint64{1445, 2939},
		undo:  func(c *Config) { c.legacyReplay = true },
		fix:   "volume/upstairs: a rejoining replica is not replayed writes its extents show flushed",
	},
	{
		name:  "a damaged only copy is replaced from a stale replica, not the newest",
		seeds: []uint64{879},
		undo:  func(c *Config) { c.legacyDonorOrder = true },
		fix:   "volume/upstairs: take an older intact copy from the newest replica first",
	},
}

func TestRegressionSeeds(t *testing.T) {
	for _, reg := range regressions {
		for _, seed := range reg.seeds {
			cfg := DefaultConfig(seed)
			if reg.wholeVolume {
				cfg.Faults = WholeVolumeCrashProbabilities()
			}
			if r := Run(cfg); len(r.Violations) > 0 {
				t.Errorf("%s: seed %d fails: %s", reg.name, seed, r.Violations[0])
			}
			reg.undo(&cfg)
			if r := Run(cfg); len(r.Violations) == 0 {
				t.Errorf("%s: seed %d passes without the fix (%s): it no longer covers the bug", reg.name, seed, reg.fix)
			}
		}
	}
}

var flagFindRegressions = flag.Int("find-regressions", 0, "list seeds below N that fail with each fix undone (to refresh regressions after the simulation changes)")

// TestFindRegressionSeeds lists, for each kept bug, seeds that fail with
// its fix undone: the simulation's own changes shift every run, so the
// kept seeds are refreshed from this list when they stop covering a bug.
func TestFindRegressionSeeds(t *testing.T) {
	if *flagFindRegressions == 0 {
		t.Skip("run with -find-regressions N")
	}
	for _, reg := range regressions {
		var found []uint64
		for seed := range uint64(*flagFindRegressions) {
			cfg := DefaultConfig(seed)
			if reg.wholeVolume {
				cfg.Faults = WholeVolumeCrashProbabilities()
			}
			reg.undo(&cfg)
			if r := Run(cfg); len(r.Violations) > 0 {
				found = append(found, seed)
			}
		}
		t.Logf("%s: %v", reg.name, found)
	}
}
