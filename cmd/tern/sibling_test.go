package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestControlWithoutItsSiblingBuildsItFromTheSourceTree is what a user
// who built only tern meets (go run ./cmd/tern, go build ./cmd/tern):
// tern control finds no tern-control beside tern or on PATH, builds it
// from tern's source tree into the user cache, saying so, and runs it,
// which answers --help.
func TestControlWithoutItsSiblingBuildsItFromTheSourceTree(t *testing.T) {
	if testing.Short() {
		t.Skip("builds tern and tern-control")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	gocache, err := exec.Command("go", "env", "GOCACHE").Output()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "tern")
	build := exec.Command("go", "build", "-o", bin, "./cmd/tern")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building tern: %v\n%s", err, out)
	}
	cache := t.TempDir()
	cmd := exec.Command(bin, "control", "--help")
	cmd.Dir = t.TempDir()
	cmd.Env = append(os.Environ(), "XDG_CACHE_HOME="+cache, "GOCACHE="+strings.TrimSpace(string(gocache)),
		"PATH="+filepath.Dir(goBinary(t)), controlBinaryEnv+"=")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("tern control --help: %v\n%s", err, out)
	}
	for _, want := range []string{"building it from " + root, "tern-control --listen ADDR", "--etcd-endpoints"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if _, err := os.Stat(filepath.Join(cache, "tern", "tern-control")); err != nil {
		t.Errorf("no tern-control in the user cache: %v", err)
	}
}

// goBinary is the go command on PATH.
func goBinary(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command")
	}
	return p
}

// TestSourceTreeIsFoundWithoutRecordedPaths checks the way to the source
// tree of a binary built with -trimpath, whose recorded file path is
// relative: the working directory or one above it, and nothing outside
// a tree of tern's.
func TestSourceTreeIsFoundWithoutRecordedPaths(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	trimmed := "tern/cmd/tern/sibling.go"
	for _, c := range []struct{ file, wd, want string }{
		{filepath.Join(root, "cmd", "tern", "sibling.go"), "/", root},
		{trimmed, filepath.Join(root, "volume", "upstairs"), root},
		{trimmed, root, root},
		{trimmed, t.TempDir(), ""},
		{trimmed, "", ""},
	} {
		if got := findSourceTree(c.file, c.wd); got != c.want {
			t.Errorf("findSourceTree(%q, %q) = %q, want %q", c.file, c.wd, got, c.want)
		}
	}
}
