package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// ternBin is the tern binary built once for the black-box tests of this
// package; they run it as a user would.
var ternBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "tern-cli-test")
	if err != nil {
		panic(err)
	}
	ternBin = filepath.Join(dir, "tern")
	// The sibling binaries beside tern are what tern control, agent and
	// bench run (tern up --hosts runs the first two).
	build := exec.Command("go", "build", "-o", dir+"/", ".", "tern/cmd/tern-control", "tern/cmd/tern-agent", "tern/cmd/tern-bench")
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		os.RemoveAll(dir)
		panic("building tern: " + err.Error())
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// runTern runs the binary and returns stdout, stderr and the exit code.
func runTern(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(ternBin, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("running tern %v: %v", args, err)
	}
	return stdout.String(), stderr.String(), code
}
