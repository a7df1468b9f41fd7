package instance

import (
	"testing"

	"tern/vmm/guests"
)

func TestDirtyGuestParamsCarryIdleAndTheRate(t *testing.T) {
	for _, tc := range []struct {
		name     string
		params   map[string]uint64
		idle     bool
		rateMiBs uint64
	}{
		{"absent", map[string]uint64{"dirty_mib_per_sec": 10}, false, 10},
		{"idle 0", map[string]uint64{"idle": 0, "dirty_mib_per_sec": 10}, false, 10},
		{"idle 1", map[string]uint64{"idle": 1, "verify_every_sec": 2}, true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := validSpec()
			s.Guest.Path, s.Guest.Params = "dirty", tc.params
			if err := Validate(&s, Host{}); err != nil {
				t.Fatalf("Validate: %v", err)
			}
			p, rate := guestParamsFor(s)
			if p.Idle != tc.idle || rate != tc.rateMiBs || p.Passes != guests.PassesForever {
				t.Errorf("params %+v rate %d; want idle %v, rate %d, passes forever", p, rate, tc.idle, tc.rateMiBs)
			}
		})
	}
}
