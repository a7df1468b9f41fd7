package agent

import (
	"fmt"
	"io"
	"os/exec"
	"time"

	"tern/internal/child"
)

// childWait bounds how long a child may take to start listening.
const childWait = 2 * time.Minute

// startVMMProcess runs `tern vmm serve` on ip, logging to log, and
// returns once it printed its URL.
func startVMMProcess(tern, ip, certs string, log io.Writer) (*child.Process, string, error) {
	cmd := exec.Command(tern, "vmm", "serve", "--listen", ip+":0", "--certs", certs)
	cmd.Stderr = log
	return child.Start(cmd, child.Options{Ready: child.Ready{Match: child.ListeningURL, Wait: childWait, What: "its URL"}})
}

// startDownstairsProcess runs `tern downstairs run` on dir at listen and
// returns once it logged "listening", with its address.
func startDownstairsProcess(tern, dir, listen, certs string, log io.Writer) (*child.Process, string, error) {
	cmd := exec.Command(tern, "downstairs", "run", "--dir", dir, "--listen", listen, "--certs", certs)
	p, addr, err := child.Start(cmd, child.Options{Ready: child.Ready{Match: child.ListeningAddr, Stderr: true, Log: log,
		Wait: childWait, What: "its listening record"}})
	if err != nil {
		return nil, "", fmt.Errorf("%w (region %s)", err, dir)
	}
	return p, addr, nil
}
