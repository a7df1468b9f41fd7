package bench

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestRunVolumeReportsEveryScenarioWithItsLimits runs the volume benchmark
// for a moment and checks the report's shape, not its speed.
func TestRunVolumeReportsEveryScenarioWithItsLimits(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three downstairs and runs twelve measurements")
	}
	rep, err := RunVolume(context.Background(), VolumeOptions{Duration: 150 * time.Millisecond, VolumeBytes: 64 << 20, Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"seqwrite_1m_qd32", "randwrite_4k_qd32", "randread_4k_qd32", "seqread_1m_qd32"}
	if len(rep.Scenarios) != len(want) {
		t.Fatalf("%d scenarios, want %d", len(rep.Scenarios), len(want))
	}
	for i, s := range rep.Scenarios {
		if s.Name != want[i] || s.IOPS <= 0 || s.LimitLocalFileIOPS <= 0 || s.LimitQUICIOPS <= 0 || s.P99us < s.P50us {
			t.Errorf("scenario %d = %+v", i, s)
		}
	}
	path := filepath.Join(t.TempDir(), "volume.json")
	if err := WriteJSONFile(path, rep); err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(path)
	var generic struct {
		Scenarios []map[string]any `json:"scenarios"`
	}
	if err := json.Unmarshal(raw, &generic); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"name", "iops", "mib_per_sec", "p50_us", "p99_us", "limit_local_file_iops", "limit_quic_iops"} {
		if _, ok := generic.Scenarios[0][key]; !ok {
			t.Errorf("JSON scenario lacks %q", key)
		}
	}
}
