package chaos

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// binDir holds the tern binary the tests run as real downstairs
// processes, built the first time a test asks for it (the proxy, fuzz and
// trend tests never do); TestMain removes it.
var (
	binDir   string
	binOnce  sync.Once
	binPath  string
	binError error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// ternBinary returns the path of a tern binary built from this checkout.
func ternBinary(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		dir, err := os.MkdirTemp("", "tern-chaos-bin-")
		if err != nil {
			binError = err
			return
		}
		binDir = dir
		path := filepath.Join(dir, "tern")
		out, err := exec.Command("go", "build", "-o", path, "tern/cmd/tern").CombinedOutput()
		if err != nil {
			binError = fmt.Errorf("building tern: %w: %s", err, out)
			return
		}
		binPath = path
	})
	if binError != nil {
		t.Fatal(binError)
	}
	return binPath
}
