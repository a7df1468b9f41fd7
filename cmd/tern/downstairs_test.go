package main

import (
	"bufio"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
)

func TestDownstairsCreatePrintsUUID(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "region")
	out, stderr, code := runTern(t, "downstairs", "create", "--dir", dir, "--block-size", "4096", "--extent-size", "1MiB", "--extent-count", "3")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if _, err := uuid.Parse(strings.TrimSpace(out)); err != nil {
		t.Fatalf("stdout %q is not a UUID", out)
	}
	js, err := os.ReadFile(filepath.Join(dir, "region.json"))
	if err != nil {
		t.Fatal(err)
	}
	var spec struct {
		UUID         string `json:"uuid"`
		ExtentBlocks int    `json:"extent_blocks"`
		ExtentCount  int    `json:"extent_count"`
	}
	if err := json.Unmarshal(js, &spec); err != nil || spec.UUID != strings.TrimSpace(out) || spec.ExtentBlocks != 256 || spec.ExtentCount != 3 {
		t.Fatalf("region.json %s", js)
	}

	id := "3f1f1a6e-8f43-4d7e-9c55-2f7e0a1b2c3d"
	out, _, code = runTern(t, "downstairs", "create", "--dir", filepath.Join(t.TempDir(), "r2"), "--extent-size", "64KiB", "--extent-count", "1", "--uuid", id, "--block-size", "512")
	if code != 0 || strings.TrimSpace(out) != id {
		t.Fatalf("with --uuid: %q exit %d", out, code)
	}
}

func TestDownstairsCreateRejectsBadGeometry(t *testing.T) {
	cases := []struct {
		args []string
		want string // sizes are written with units, as everywhere
	}{
		{[]string{"--extent-size", "5000", "--extent-count", "1"}, "--extent-size 5000B is not a positive multiple of the 4KiB block size"},
		{[]string{"--extent-count", "0"}, "--extent-count"},
		{[]string{"--block-size", "1000", "--extent-count", "1"}, "--block-size 1000B: want 512B or 4KiB"},
		{[]string{"--extent-count", "1", "--uuid", "not-a-uuid"}, "uuid"},
	}
	for _, c := range cases {
		_, stderr, code := runTern(t, append([]string{"downstairs", "create", "--dir", t.TempDir() + "/r"}, c.args...)...)
		if code == 0 || !strings.Contains(stderr, c.want) {
			t.Errorf("%v: exit %d, stderr %q, want it to name %q", c.args, code, stderr, c.want)
		}
	}
}

func TestDownstairsRunListensAndStopsOnSIGTERM(t *testing.T) {
	base := t.TempDir()
	dir, certs := filepath.Join(base, "region"), filepath.Join(base, "certs")
	if _, stderr, code := runTern(t, "certs", "init", "--dir", certs); code != 0 {
		t.Fatalf("certs init: %s", stderr)
	}
	if _, stderr, code := runTern(t, "downstairs", "create", "--dir", dir, "--extent-size", "1MiB", "--extent-count", "2"); code != 0 {
		t.Fatalf("create: %s", stderr)
	}
	cmd := exec.Command(ternBin, "downstairs", "run", "--dir", dir, "--listen", "127.0.0.1:0", "--certs", certs, "--metrics-listen", "127.0.0.1:0", "--log-level", "info")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	listening := make(chan map[string]any, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			var rec map[string]any
			if json.Unmarshal(sc.Bytes(), &rec) == nil && rec["msg"] == "listening" {
				listening <- rec
			}
		}
		io.Copy(io.Discard, stderr)
		exited <- cmd.Wait()
	}()
	select {
	case rec := <-listening:
		if rec["component"] != "downstairs" || !strings.HasPrefix(rec["addr"].(string), "127.0.0.1:") {
			t.Errorf("listening record %v", rec)
		}
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		t.Fatal("no listening log line")
	}
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v", err)
		}
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		t.Fatal("did not stop on SIGTERM")
	}
}
