package main

import (
	"encoding/json"
	"testing"
)

// TestVolumeStatusAgainstRealDownstairs runs `tern volume status --json`
// against three downstairs processes, one of them stopped: it reports the
// two it reached and exits 0, and exits non-zero when none answers.
func TestVolumeStatusAgainstRealDownstairs(t *testing.T) {
	v := startVolumeProcesses(t)
	v.stop(t, 2)
	out, errOut, code := runTern(t, "volume", "status", "--targets", v.targetList(), "--certs", v.certs, "--json", "--timeout", "2s")
	if code != 0 {
		t.Fatalf("status exited %d: %s", code, errOut)
	}
	var rep struct {
		Replicas []struct {
			Target    string          `json:"target"`
			Reachable bool            `json:"reachable"`
			Region    json.RawMessage `json:"region"`
		} `json:"replicas"`
		ExtentsTotal       *int `json:"extents_total"`
		ExtentsDisagreeing *int `json:"extents_disagreeing"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("status --json printed %q: %v", out, err)
	}
	if len(rep.Replicas) != 3 || !rep.Replicas[0].Reachable || !rep.Replicas[1].Reachable || rep.Replicas[2].Reachable {
		t.Fatalf("replicas = %+v", rep.Replicas)
	}
	if rep.ExtentsTotal == nil || *rep.ExtentsTotal == 0 || rep.ExtentsDisagreeing == nil || *rep.ExtentsDisagreeing != 0 {
		t.Fatalf("report %s", out)
	}
	v.stop(t, 0)
	v.stop(t, 1)
	if _, _, code := runTern(t, "volume", "status", "--targets", v.targetList(), "--certs", v.certs, "--timeout", "1s"); code == 0 {
		t.Fatal("status with no replica reachable exited 0")
	}
}
