package sim

// Shrink looks for a smaller fault schedule that still breaks an
// invariant: it re-runs cfg with subsets of res's faults skipped
// (delta debugging, at most budget runs) and keeps every removal that
// still fails. It returns the smallest failing run found and its skip
// set (which Config.Skip replays).
func Shrink(cfg Config, res Result, budget int) (Result, map[int]bool) {
	skip := map[int]bool{}
	for n := range cfg.Skip {
		skip[n] = true
	}
	best := res
	kept := append([]int(nil), res.Injected...)
	chunks := 2
	for budget > 0 && len(kept) > 0 {
		size := (len(kept) + chunks - 1) / chunks
		removed := false
		for start := 0; start < len(kept) && budget > 0; start += size {
			end := min(start+size, len(kept))
			try := map[int]bool{}
			for n := range skip {
				try[n] = true
			}
			for _, n := range kept[start:end] {
				try[n] = true
			}
			c := cfg
			c.Skip, c.KeepTrace = try, false
			r := Run(c)
			budget--
			if len(r.Violations) > 0 {
				skip, best = try, r
				kept = r.Injected
				removed = true
				break
			}
		}
		switch {
		case removed:
			chunks = max(chunks-1, 2)
		case size == 1:
			return best, skip
		default:
			chunks = min(chunks*2, len(kept))
		}
	}
	return best, skip
}
