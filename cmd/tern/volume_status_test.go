package main

import (
	"encoding/json"
	"os"
	"strings"
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

// TestVolumeStatusFailsWhenReplicasServeDifferentRegions: a replica with
// another uuid is an error naming the difference (exit 1), while extents
// that merely disagree are a finding (exit 0).
func TestVolumeStatusFailsWhenReplicasServeDifferentRegions(t *testing.T) {
	v := startVolumeProcesses(t)
	common := []string{"--targets", v.targetList(), "--certs", v.certs}
	v.stop(t, 2)
	if _, errOut, code := runTern(t, append([]string{"volume", "fill", "--gen", "1", "--length", "1MiB", "--activation-quorum-wait", "1s"}, common...)...); code != 0 {
		t.Fatalf("fill on two replicas exited %d: %s", code, errOut)
	}
	v.start(t, 2)
	out, errOut, code := runTern(t, append([]string{"volume", "status"}, common...)...)
	if code != 0 || !strings.Contains(out, "1 disagreeing") {
		t.Fatalf("status of a stale replica exited %d: %s %s", code, out, errOut)
	}
	v.stop(t, 2)
	if err := os.RemoveAll(v.dirs[2]); err != nil {
		t.Fatal(err)
	}
	if _, errOut, code := runTern(t, "downstairs", "create", "--dir", v.dirs[2], "--block-size", "4096",
		"--extent-size", "1MiB", "--extent-count", "4"); code != 0 {
		t.Fatalf("downstairs create: %s", errOut)
	}
	v.start(t, 2)
	for _, args := range [][]string{{"volume", "status"}, {"volume", "status", "--json"}} {
		_, errOut, code := runTern(t, append(args, common...)...)
		lines := stderrLines(errOut)
		if code != 1 || len(lines) != 1 || !strings.Contains(lines[0], "region uuid") || !strings.Contains(lines[0], v.addrs[2]) {
			t.Errorf("%v with another region on replica 2 exited %d with %q: want exit 1 naming the uuid and %s", args, code, errOut, v.addrs[2])
		}
	}
}
