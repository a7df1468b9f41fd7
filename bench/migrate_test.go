package bench

import (
	"testing"

	"tern/vmm/instance"
)

// TestMigrateRateZeroIsTheIdleGuest: the benchmark's rate 0 asks the API
// for the idle dirty guest (dirty_mib_per_sec 0 alone would be
// unthrottled), and every rate's spec is one the server accepts.
func TestMigrateRateZeroIsTheIdleGuest(t *testing.T) {
	for _, tc := range []struct {
		rate, idle uint64
		idleSet    bool
	}{{0, 1, true}, {10, 0, false}, {100, 0, false}} {
		s := dirtySpec("bench-256", 256, tc.rate)
		if err := s.Validate(instance.Host{}); err != nil {
			t.Errorf("rate %d: Validate: %v", tc.rate, err)
		}
		p := s.Guest.Params
		if idle, ok := p["idle"]; idle != tc.idle || ok != tc.idleSet || p["dirty_mib_per_sec"] != tc.rate {
			t.Errorf("rate %d: params %v; want idle %d (set %v) and dirty_mib_per_sec %d", tc.rate, p, tc.idle, tc.idleSet, tc.rate)
		}
	}
}
