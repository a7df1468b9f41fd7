package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"time"

	"tern/internal/child"
)

// upChild is one process `tern up` started (internal/child: killed if
// tern up dies, in its own process group so that a terminal's ^C reaches
// tern up alone, which then stops the children in order).
type upChild struct {
	name string
	proc *child.Process
	// exited is closed once the child was reaped.
	exited <-chan struct{}
}

// startUpChild starts cmd as child name and, when ready is set, waits
// for its ready line. If the child ends before tern up stops it, one line
// on out names it and says how it ended.
func startUpChild(name string, cmd *exec.Cmd, ready child.Ready, out io.Writer) (*upChild, string, error) {
	p, v, err := child.Start(cmd, child.Options{Ready: ready, OnExit: func(p *child.Process) {
		if !p.Stopping() {
			fmt.Fprintf(out, "tern up: %s (pid %d) ended: %s\n", name, p.Cmd.Process.Pid, exitDescription(p.Cmd.ProcessState))
		}
	}})
	if err != nil {
		return nil, "", err
	}
	return &upChild{name: name, proc: p, exited: p.Exited()}, v, nil
}

// stop sends SIGTERM, waits up to grace, then kills; it returns once the
// child was reaped.
func (c *upChild) stop(grace time.Duration) {
	c.proc.Stop(grace)
}

// exitDescription says how a process ended: "exit status 1", "signal:
// killed".
func exitDescription(ps *os.ProcessState) string {
	if ps == nil {
		return "not reaped"
	}
	return ps.String()
}

// startUpDownstairs runs `tern downstairs run` on dir, logging to logPath,
// and returns once it logged "listening", with the address it serves.
func startUpDownstairs(self, name, dir, certs, logPath string, wait time.Duration, out io.Writer) (*upChild, string, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, "", fmt.Errorf("opening %s log: %w", name, err)
	}
	cmd := exec.Command(self, "downstairs", "run", "--dir", dir, "--listen", "127.0.0.1:0", "--certs", certs)
	c, addr, err := startUpChild(name, cmd, child.Ready{Match: child.ListeningAddr, Stderr: true, Log: logFile,
		Wait: wait, What: "its listening record"}, out)
	if err != nil {
		logFile.Close()
		return nil, "", fmt.Errorf("%s: %w; see %s", name, err, logPath)
	}
	go func() { <-c.exited; logFile.Close() }()
	return c, addr, nil
}

// startUpVMM runs `tern vmm serve` on a free loopback port, logging to
// logPath, and returns once it printed its URL.
func startUpVMM(self, certs, logPath string, wait time.Duration, out io.Writer) (*upChild, string, error) {
	return startUpListener(self, "vmm", logPath, wait, out, "vmm", "serve", "--listen", "127.0.0.1:0", "--certs", certs)
}

// startUpListener runs tern args as child name, logging to logPath, and
// returns once it printed "listening on URL", with the URL. If the child
// ends before tern up stops it, one line on out says so.
func startUpListener(self, name, logPath string, wait time.Duration, out io.Writer, args ...string) (*upChild, string, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, "", fmt.Errorf("opening %s log: %w", name, err)
	}
	defer logFile.Close() // the child has its own descriptor
	cmd := exec.Command(self, args...)
	cmd.Stderr = logFile
	c, url, err := startUpChild(name, cmd, child.Ready{Match: child.ListeningURL, Wait: wait, What: "its URL"}, out)
	if err != nil {
		return nil, "", fmt.Errorf("%s: %w; see %s", name, err, logPath)
	}
	return c, url, nil
}
