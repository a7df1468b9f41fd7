package apiv1

import (
	"encoding/json"
	"slices"
	"testing"
)

func TestProgressJSONKeys(t *testing.T) {
	b, err := json.Marshal(Progress{ID: "m", Phase: PhaseFinish, Round: 3, BytesSent: 1, PagesRemaining: 2,
		DirtyPagesPerSec: 3, BandwidthBytesPerSec: 4, EstimatedDowntimeMs: 5, TotalMs: 6, DowntimeMs: 7})
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	want := []string{"bandwidth_bytes_per_sec", "bytes_sent", "dirty_pages_per_sec", "downtime_ms",
		"estimated_downtime_ms", "id", "pages_remaining", "phase", "round", "total_ms"}
	if !slices.Equal(keys, want) || m["phase"] != "finish" {
		t.Fatalf("keys %v (phase %v), want %v", keys, m["phase"], want)
	}
	var back Progress
	if err := json.Unmarshal(b, &back); err != nil || back.ID != "m" || back.DowntimeMs != 7 {
		t.Fatalf("decoding %s: %+v, %v", b, back, err)
	}
	if b, err := json.Marshal(Progress{}); err != nil || string(b) != "null" {
		t.Fatalf("no migration encodes as %s, %v; want null", b, err)
	}
	back = Progress{ID: "x"}
	if err := json.Unmarshal([]byte("null"), &back); err != nil || back.Active() {
		t.Fatalf("null decodes as %+v, %v; want no migration", back, err)
	}
}
