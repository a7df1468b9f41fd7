package sim

import "strings"

// Shrink looks for a shorter run that still breaks an invariant, within
// budget re-runs: first it drops faults (delta debugging over the fault
// numbers res injected: every subset it can skip while the run still
// fails stays skipped), then it halves the faulty phase while the run
// still fails. It returns the configuration of the shortest failing run
// found (its Skip and Steps replay it) and that run's result.
//
// A run that fails only for making no progress (too few faults or ticks
// left to do anything) does not count as still failing, unless that was
// the original failure.
func Shrink(cfg Config, res Result, budget int) (Config, Result) {
	best, bestCfg := res, cfg
	wasIdle := len(res.Violations) > 0 && isNoProgress(res.Violations[0])
	try := func(c Config) bool {
		budget--
		c.KeepTrace = false
		r := Run(c)
		if len(r.Violations) == 0 || isNoProgress(r.Violations[0]) && !wasIdle {
			return false
		}
		best, bestCfg = r, c
		return true
	}
	skip := map[int]bool{}
	for n := range cfg.Skip {
		skip[n] = true
	}
	kept := append([]int(nil), res.Injected...)
	chunks := 2
	for budget > 0 && len(kept) > 0 {
		size := (len(kept) + chunks - 1) / chunks
		removed := false
		for start := 0; start < len(kept) && budget > 0; start += size {
			end := min(start+size, len(kept))
			next := map[int]bool{}
			for n := range skip {
				next[n] = true
			}
			for _, n := range kept[start:end] {
				next[n] = true
			}
			c := bestCfg
			c.Skip = next
			if try(c) {
				skip, kept, removed = next, best.Injected, true
				break
			}
		}
		switch {
		case removed:
			chunks = max(chunks-1, 2)
		case size == 1:
			budget = min(budget, 8)
			goto steps
		default:
			chunks = min(chunks*2, len(kept))
		}
	}
steps:
	for budget > 0 && bestCfg.Steps > 50 {
		c := bestCfg
		c.Steps /= 2
		if !try(c) {
			break
		}
	}
	return bestCfg, best
}

// isNoProgress reports whether violation v is the progress check's.
func isNoProgress(v string) bool { return strings.Contains(v, noProgress) }
