package planebench

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"tern/bench"
)

// TestRunDataplaneReportsBothPaths runs the data-plane benchmark briefly
// and checks what it reports (the contract keys, both paths measured),
// not how fast it was.
func TestRunDataplaneReportsBothPaths(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: network namespaces and eBPF")
	}
	rep, err := RunDataplane(context.Background(), DataplaneOptions{RoundTrips: 200, Duration: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []DataplanePath{rep.EBPF, rep.Plain} {
		if p.P50Micros <= 0 || p.P99Micros < p.P50Micros || p.DatagramsReceived == 0 || p.ThroughputMbps <= 0 {
			t.Errorf("path figures %+v: want positive latencies and throughput", p)
		}
	}
	path := filepath.Join(t.TempDir(), "dataplane.json")
	if err := bench.WriteJSONFile(path, rep); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var top map[string]any
	if err := json.Unmarshal(b, &top); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"throughput_ratio", "p99_ratio", "ebpf", "plain"} {
		if _, ok := top[k]; !ok {
			t.Errorf("the JSON has no top-level %q: %s", k, b)
		}
	}
	if r, _ := top["throughput_ratio"].(float64); r <= 0 {
		t.Errorf("throughput_ratio %v: want the ratio of two measured figures", top["throughput_ratio"])
	}
}
