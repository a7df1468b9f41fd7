package sim

import "testing"

// regressions are seeds that found bugs in the real code, each run with
// the fix undone (it must still fail, or the seed no longer covers the
// bug) and as the code stands (it must pass).
var regressions = []struct {
	name  string
	seeds []uint64
	undo  func(*Config)
	fix   string // the commit subject of the fix
}{
	{
		name:  "restarted replica replayed over lost writes",
		seeds: []uint64{1, 9, 175},
		undo:  func(c *Config) { c.legacyRejoin = true },
		fix:   "volume: a downstairs that restarted with unflushed writes is repaired, not replayed",
	},
	{
		name:  "live repair stuck on a source with a flipped bit",
		seeds: []uint64{41, 119, 155, 215},
		undo:  func(c *Config) { c.legacySourceChoice = true },
		fix:   "volume/upstairs: live repair copies from another source after one served bad data",
	},
}

func TestRegressionSeeds(t *testing.T) {
	for _, reg := range regressions {
		for _, seed := range reg.seeds {
			cfg := DefaultConfig(seed)
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
