package chaos

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// ternBin is the tern binary the tests run as real downstairs processes,
// built once per test binary.
var ternBin string

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "tern-chaos-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	ternBin = filepath.Join(dir, "tern")
	build := exec.Command("go", "build", "-o", ternBin, "tern/cmd/tern")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building tern:", err)
		return 1
	}
	return m.Run()
}
