package serve

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// TernBinaryEnv is where tern tells a sibling binary it runs (tern-agent,
// tern-bench, tern-control) which tern binary ran it.
const TernBinaryEnv = "TERN_BIN"

// TernBinary is the tern binary a sibling binary starts its children
// from (the agent's vmm and downstairs, a benchmark's vmms): the one that
// ran it ($TERN_BIN), else tern beside this binary, else tern on PATH.
func TernBinary() (string, error) {
	if p := os.Getenv(TernBinaryEnv); p != "" {
		return p, nil
	}
	if self, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(self), "tern")
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			return p, nil
		}
	}
	p, err := exec.LookPath("tern")
	if err != nil {
		return "", fmt.Errorf("finding the tern binary to start children from: none in TERN_BIN, beside this binary or on PATH")
	}
	return p, nil
}
