package quorum

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// generous bounds every wait; nothing asserts on time.
const generous = 3 * time.Minute

// ternBin is the tern binary TestMain built from this checkout.
var ternBin string

// TestMain runs one etcd member when memberEnv says so (the tests start
// members as processes of their own, to SIGKILL them), else builds tern
// and tern-control beside it (what tern control runs),
// and runs the tests. Nothing here needs KVM, so unlike control/multihost
// these tests never move into the emulated test host.
func TestMain(m *testing.M) {
	if spec := os.Getenv(memberEnv); spec != "" {
		os.Exit(runMember(spec))
	}
	dir, err := os.MkdirTemp("", "tern-quorum-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	ternBin = filepath.Join(dir, "tern")
	if out, err := exec.Command("go", "build", "-o", dir+"/", "tern/cmd/tern", "tern/cmd/tern-control").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building tern and tern-control: %v: %s\n", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}
