package kvmtest

import (
	"os/exec"
	"testing"
	"time"

	"tern/internal/child"
)

// downstairsWait bounds how long a downstairs process may take to start
// listening, and to stop once asked.
const downstairsWait = 2 * time.Minute

// Downstairs is one `tern downstairs run` process of a test that runs a
// guest on a volume.
type Downstairs struct {
	// Addr is the address it listens on.
	Addr string
	proc *child.Process
}

// StartDownstairs runs the tern binary's `downstairs run` on dir with the
// certificates in certs, on a free loopback port, and waits for its
// "listening" log record; t's cleanup stops it.
func StartDownstairs(t testing.TB, dir, certs string) *Downstairs {
	t.Helper()
	return StartDownstairsAt(t, dir, certs, "127.0.0.1:0")
}

// StartDownstairsAt is StartDownstairs listening on addr: a downstairs
// restarted where its upstairs reconnects.
func StartDownstairsAt(t testing.TB, dir, certs, addr string) *Downstairs {
	t.Helper()
	cmd := exec.Command(Tern(t), "downstairs", "run", "--dir", dir, "--listen", addr, "--certs", certs)
	proc, addr, err := child.Start(cmd, child.Options{Ready: child.Ready{Match: child.ListeningAddr, Stderr: true,
		Wait: downstairsWait, What: "its listening record"}})
	if err != nil {
		t.Fatalf("downstairs on %s: %v", dir, err)
	}
	d := &Downstairs{Addr: addr, proc: proc}
	t.Cleanup(d.Stop)
	return d
}

// Stop stops the process with SIGTERM (SIGKILL if it has not exited
// within a bound) and waits for it; stopping it again does nothing.
func (d *Downstairs) Stop() { d.proc.Stop(downstairsWait) }

// Kill ends the process with SIGKILL, as a crash would, and waits for it.
func (d *Downstairs) Kill() { d.proc.Kill() }
