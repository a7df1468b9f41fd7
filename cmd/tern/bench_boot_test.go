package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"tern/bench"
	"tern/internal/kvmhost"
	"tern/vmm/kvm"
)

// bootJSONKeys are the contract's keys of tern bench boot --json.
var bootJSONKeys = []string{"tern_wall_ms_p50", "qemu_wall_ms_p50", "ratio_wall", "tern_rss_mib", "qemu_rss_mib", "inproc_boot_ms_p50", "bare_kvm_ms_p50"}

// wantBenchRefusedInside runs tern with args as the emulated test host's
// init would run it and wants exit status 1 with the refusal alone on
// stderr.
func wantBenchRefusedInside(t *testing.T, args ...string) {
	t.Helper()
	cmd := exec.Command(ternBin, args...)
	cmd.Env = append(os.Environ(), kvmhost.InsideEnv+"=1")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	err := cmd.Run()
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.ExitCode() != 1 {
		t.Fatalf("tern %s inside: %v; want exit status 1", strings.Join(args, " "), err)
	}
	if want := "tern: " + kvmhost.ErrBenchmarkInEmulatedHost.Error() + "\n"; stderr.String() != want {
		t.Fatalf("stderr = %q\nwant %q", stderr.String(), want)
	}
}

// TestBenchBootRefusesInsideTheEmulatedTestHost runs tern bench boot as
// the emulated test host's init would run it: it exits 1, saying why.
func TestBenchBootRefusesInsideTheEmulatedTestHost(t *testing.T) {
	wantBenchRefusedInside(t, "bench", "boot", "--runs", "1")
}

// runBenchBoot runs tern bench boot --runs 2 with env and returns its
// JSON report as raw values by key, and its stdout.
func runBenchBoot(t *testing.T, env []string) (map[string]json.RawMessage, string) {
	t.Helper()
	if err := kvm.Probe(); err != nil {
		t.Skipf("no usable /dev/kvm: %v", err)
	}
	if kvmhost.InsideEmulatedHost() {
		t.Skip("tern bench boot refuses to run inside the emulated test host")
	}
	path := filepath.Join(t.TempDir(), "boot.json")
	cmd := exec.Command(ternBin, "bench", "boot", "--runs", "2", "--json", path)
	cmd.Env = env
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("tern bench boot: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]json.RawMessage
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatalf("report: %v\n%s", err, b)
	}
	for _, k := range bootJSONKeys {
		if _, ok := got[k]; !ok {
			t.Errorf("report lacks %q:\n%s", k, b)
		}
	}
	return got, stdout.String()
}

// positive reports whether raw is a JSON number above 0.
func positive(raw json.RawMessage) bool {
	var v *float64
	return json.Unmarshal(raw, &v) == nil && v != nil && *v > 0
}

// TestBenchBootShortRun runs two samples of each kind and checks that
// every contract key holds a figure (QEMU's only when it is installed).
func TestBenchBootShortRun(t *testing.T) {
	got, _ := runBenchBoot(t, os.Environ())
	_, qerr := exec.LookPath("qemu-system-x86_64")
	for _, k := range bootJSONKeys {
		if strings.HasPrefix(k, "qemu_") || k == "ratio_wall" {
			if qerr != nil {
				continue
			}
		}
		if !positive(got[k]) {
			t.Errorf("%s = %s, want a figure above 0", k, got[k])
		}
	}
}

// TestBenchBootWithoutQEMU runs it with a PATH that holds no QEMU: the
// qemu_ keys and ratio_wall are null and the table says why.
func TestBenchBootWithoutQEMU(t *testing.T) {
	var env []string
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "PATH=") {
			env = append(env, e)
		}
	}
	env = append(env, "PATH="+t.TempDir())
	got, table := runBenchBoot(t, env)
	for _, k := range []string{"qemu_wall_ms_p50", "qemu_rss_mib", "ratio_wall"} {
		if string(got[k]) != "null" {
			t.Errorf("%s = %s without QEMU, want null", k, got[k])
		}
	}
	for _, k := range []string{"tern_wall_ms_p50", "inproc_boot_ms_p50", "bare_kvm_ms_p50"} {
		if !positive(got[k]) {
			t.Errorf("%s = %s, want a figure above 0", k, got[k])
		}
	}
	if !strings.Contains(table, bench.ErrNoQEMU.Error()) {
		t.Errorf("table does not say QEMU was skipped:\n%s", table)
	}
}
