package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestBenchDataplaneWritesBothRatios runs tern bench dataplane briefly and
// checks its table and the JSON's contract keys, not the figures.
func TestBenchDataplaneWritesBothRatios(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: network namespaces and eBPF")
	}
	path := filepath.Join(t.TempDir(), "dataplane.json")
	out, err := exec.Command(ternBin, "bench", "dataplane", "--round-trips", "200", "--duration", "500ms", "--json", path).Output()
	if err != nil {
		t.Fatalf("tern bench dataplane: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "throughput_ratio") || !strings.Contains(string(out), "plain routed veth") {
		t.Errorf("table without the ratios or the limit:\n%s", out)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(b, &top); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"throughput_ratio", "p99_ratio", "ebpf", "plain"} {
		if _, ok := top[k]; !ok {
			t.Errorf("JSON without %q: %s", k, b)
		}
	}
}

// TestAgentDataplaneFlagWantsAnIPv4 checks --dataplane is refused, saying
// why, when it is not an IPv4 address.
func TestAgentDataplaneFlagWantsAnIPv4(t *testing.T) {
	dir := t.TempDir()
	if out, err := exec.Command(ternBin, "certs", "init", "--dir", filepath.Join(dir, "certs")).CombinedOutput(); err != nil {
		t.Fatalf("tern certs: %v\n%s", err, out)
	}
	out, err := exec.Command(ternBin, "agent", "--data-dir", filepath.Join(dir, "data"), "--certs", filepath.Join(dir, "certs"),
		"--dataplane", "fd00::1").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "want the host's underlay IPv4 address") {
		t.Fatalf("tern agent --dataplane fd00::1: %v\n%s", err, out)
	}
}
