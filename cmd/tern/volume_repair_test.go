package main

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"tern/volume/extent"
	"tern/volume/ids"
)

// TestVolumeRepairReconcilesAStaleReplica runs the README's commands
// against downstairs processes: a fill while replica 2 is down leaves it
// stale; `tern volume repair --json` brings it back, printing progress
// lines that end with the final 100%; status then finds no disagreement
// and verify passes.
func TestVolumeRepairReconcilesAStaleReplica(t *testing.T) {
	v := startVolumeProcesses(t)
	v.stop(t, 2)
	common := []string{"--targets", v.targetList(), "--certs", v.certs, "--activation-quorum-wait", "1s", "--log-level", "warn"}
	if _, errOut, code := runTern(t, append([]string{"volume", "fill", "--gen", "1", "--seed", "5", "--length", "1MiB"}, common...)...); code != 0 {
		t.Fatalf("fill with two replicas exited %d: %s", code, errOut)
	}
	v.start(t, 2)
	// All three are up now: a short quorum wait could let the restarted
	// replica, slow to answer on a loaded machine, miss the activation
	// that is to repair it (the last flag wins).
	out, errOut, code := runTern(t, append([]string{"volume", "repair", "--gen", "2", "--json"}, append(common, "--activation-quorum-wait", "60s")...)...)
	if code != 0 {
		t.Fatalf("repair exited %d: %s", code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var last map[string]any
	prevDone := -1.0
	for _, line := range lines {
		var p map[string]any
		if err := json.Unmarshal([]byte(line), &p); err != nil {
			t.Fatalf("progress line %q: %v", line, err)
		}
		for _, key := range []string{"phase", "extents_total", "extents_done", "blocks_compared", "bytes_total", "bytes_done", "bytes_per_sec", "eta_seconds", "started_at", "updated_at"} {
			if _, ok := p[key]; !ok {
				t.Fatalf("progress line %q lacks %q", line, key)
			}
		}
		if done := p["bytes_done"].(float64); done < prevDone {
			t.Fatalf("bytes_done went backwards: %v after %v", done, prevDone)
		} else {
			prevDone = done
		}
		last = p
	}
	if last["phase"] != "done" || last["extents_done"] != last["extents_total"] || last["bytes_done"] != last["bytes_total"] {
		t.Fatalf("last progress line is not the final 100%%: %v", last)
	}
	if last["bytes_done"].(float64) != 1<<20 {
		t.Errorf("repair moved %v bytes, want the 1 MiB replica 2 missed", last["bytes_done"])
	}
	if !strings.Contains(errOut, "repaired") {
		t.Errorf("no human summary on stderr: %q", errOut)
	}
	statusOut, errOut, code := runTern(t, "volume", "status", "--targets", v.targetList(), "--certs", v.certs, "--json")
	if code != 0 || !strings.Contains(statusOut, `"extents_disagreeing":0`) {
		t.Fatalf("status after repair exited %d: %s %s", code, statusOut, errOut)
	}
	// Every replica now holds the same blocks: compare their recorded
	// hashes extent by extent on disk.
	for i := range v.running {
		v.stop(t, i)
	}
	want := regionHashes(t, v.dirs[0])
	for _, dir := range v.dirs[1:] {
		if got := regionHashes(t, dir); !slices.Equal(got, want) {
			t.Fatalf("replica %s differs from replica 0 after repair", dir)
		}
	}
}

func regionHashes(t *testing.T, dir string) []uint64 {
	t.Helper()
	r, err := extent.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var all []uint64
	for e := range r.Spec().ExtentCount {
		h, err := r.ExtentHashes(ids.ExtentID(e), nil)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, h...)
	}
	return all
}
