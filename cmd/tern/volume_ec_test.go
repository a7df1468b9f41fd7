package main

import (
	"bytes"
	"crypto/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The erasure-coded walk-through on real downstairs processes: six
// shards of a 4+2 volume; two of them killed (SIGKILL) while a fill runs;
// the fill completes and verifies; the two come back and are rebuilt by
// repair; with two other shards gone the volume still verifies, and a
// scrub with all six finds every stripe consistent.
func TestVolumeECKillTwoDuringFillThenRepair(t *testing.T) {
	v := startVolumeProcessesN(t, "4MiB", 6)
	vol := []string{"--layout", "ec:4+2", "--targets", v.targetList(), "--certs", v.certs, "--log-level", "warn"}
	fill := exec.Command(ternBin, append([]string{"volume", "fill", "--gen", "1", "--seed", "5", "--io-timeout", "30s"}, vol...)...)
	var fillOut, fillErr bytes.Buffer
	fill.Stdout, fill.Stderr = &fillOut, &fillErr
	if err := fill.Start(); err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{1, 4} {
		v.waitRecord(t, i, func(r map[string]any) bool { return r["msg"] == "activated" })
		v.kill(t, i)
	}
	if err := fill.Wait(); err != nil {
		t.Fatalf("fill with two shards killed: %v: %s", err, fillErr.String())
	}
	if !strings.Contains(fillOut.String(), "filled ") {
		t.Fatalf("fill printed %q", fillOut.String())
	}
	if _, errOut, code := runTern(t, append([]string{"volume", "verify", "--gen", "2", "--seed", "5"}, vol...)...); code != 0 {
		t.Fatalf("verify on four shards exited %d: %s", code, errOut)
	}
	for _, i := range []int{1, 4} {
		v.start(t, i)
	}
	_, errOut, code := runTern(t, append([]string{"volume", "repair", "--gen", "3", "--json"}, vol...)...)
	if code != 0 {
		t.Fatalf("repair exited %d: %s", code, errOut)
	}
	if !strings.Contains(errOut, "activation reconciled") {
		t.Fatalf("repair summary %q", errOut)
	}
	for _, i := range []int{0, 5} {
		v.stop(t, i)
	}
	if _, errOut, code := runTern(t, append([]string{"volume", "verify", "--gen", "4", "--seed", "5", "--activation-quorum-wait", "500ms"}, vol...)...); code != 0 {
		t.Fatalf("verify without shards 0 and 5 after the repair exited %d: %s", code, errOut)
	}
	for _, i := range []int{0, 5} {
		v.start(t, i)
	}
	out, errOut, code := runTern(t, append([]string{"volume", "scrub", "--gen", "5"}, vol...)...)
	if code != 0 || !strings.Contains(out, "rewrote 0 blocks") {
		t.Fatalf("scrub exited %d: %s %s", code, out, errOut)
	}
}

// Three shards of a 4+2 volume lost: a fill cannot run, and says which
// shards are missing.
func TestVolumeECBelowKShardsFailsNamingThem(t *testing.T) {
	v := startVolumeProcessesN(t, "1MiB", 6)
	for _, i := range []int{0, 2, 3} {
		v.stop(t, i)
	}
	_, errOut, code := runTern(t, "volume", "fill", "--gen", "1", "--layout", "ec:4+2", "--targets", v.targetList(), "--certs", v.certs,
		"--activation-quorum-wait", "300ms", "--activate-timeout", "2s")
	if code == 0 {
		t.Fatal("fill with three of six shards succeeded")
	}
	if !strings.Contains(errOut, "3 of 6 shards reachable") || !strings.Contains(errOut, v.addrs[2]) {
		t.Fatalf("fill error %q does not say 3 of 6 shards and name the missing ones", errOut)
	}
}

// --layout is checked before anything is reached: a malformed or
// out-of-range layout, or a target count that does not match it.
func TestVolumeLayoutFlagChecked(t *testing.T) {
	for _, tc := range []struct{ layout, targets, want string }{
		{"ec:9+2", "127.0.0.1:1,127.0.0.1:2", `--layout "ec:9+2": want replicated or ec:K+M`},
		{"raid5", "127.0.0.1:1", `--layout "raid5"`},
		{"ec:4+2", "127.0.0.1:1,127.0.0.1:2,127.0.0.1:3", "--layout ec:4+2 wants 6 addresses (one per shard), got 3"},
		{"ec:2+1", "127.0.0.1:1,127.0.0.1:2,127.0.0.1:1", "shard 2 \"127.0.0.1:1\" repeats shard 0"},
	} {
		_, errOut, code := runTern(t, "volume", "fill", "--gen", "1", "--certs", t.TempDir(), "--layout", tc.layout, "--targets", tc.targets)
		if code == 0 || !strings.Contains(errOut, tc.want) {
			t.Errorf("--layout %s --targets %s: exit %d, %q; want %q", tc.layout, tc.targets, code, errOut, tc.want)
		}
	}
}

// `tern volume nbd --layout ec:4+2` exports the erasure-coded volume to
// standard tools: an image written in with qemu-img reads back with
// nbdcopy, and again after two of the six downstairs are stopped.
func TestVolumeECNBDImagesInAndOut(t *testing.T) {
	needTools(t, "qemu-img", "nbdcopy")
	v := startVolumeProcessesN(t, "1MiB", 6)
	p := startNBD(t, v, 1, "--layout", "ec:4+2")
	// Four shards of 4 MiB but each one's metadata block.
	size := 4 * (4<<20 - 4096)
	dir := t.TempDir()
	raw := filepath.Join(dir, "random.raw")
	data := make([]byte, size)
	rand.Read(data)
	if err := os.WriteFile(raw, data, 0o644); err != nil {
		t.Fatal(err)
	}
	runTool(t, "qemu-img", "convert", "-n", "-f", "raw", "-O", "raw", raw, p.uri)
	runTool(t, "qemu-img", "compare", "-f", "raw", "-F", "raw", raw, p.uri)
	for _, i := range []int{0, 5} {
		v.stop(t, i)
	}
	out := filepath.Join(dir, "out.raw")
	runTool(t, "nbdcopy", p.uri, out)
	if got, err := os.ReadFile(out); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("nbdcopy's copy with two shards stopped differs from the image written (err %v)", err)
	}
	p.stop(t)
}
