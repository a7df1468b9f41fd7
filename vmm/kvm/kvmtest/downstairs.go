package kvmtest

import (
	"bufio"
	"encoding/json"
	"io"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// downstairsWait bounds how long a downstairs process may take to start
// listening, and to stop once asked.
const downstairsWait = 2 * time.Minute

// Downstairs is one `tern downstairs run` process of a test that runs a
// guest on a volume.
type Downstairs struct {
	// Addr is the address it listens on.
	Addr   string
	cmd    *exec.Cmd
	exited chan error
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
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d := &Downstairs{cmd: cmd, exited: make(chan error, 1)}
	listening := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			var rec map[string]any
			if json.Unmarshal(sc.Bytes(), &rec) == nil && rec["msg"] == "listening" {
				addr, _ := rec["addr"].(string)
				select {
				case listening <- addr:
				default:
				}
			}
		}
		io.Copy(io.Discard, stderr)
		d.exited <- cmd.Wait()
	}()
	select {
	case d.Addr = <-listening:
	case err := <-d.exited:
		t.Fatalf("downstairs on %s exited before listening: %v", dir, err)
	case <-time.After(downstairsWait):
		cmd.Process.Kill()
		t.Fatalf("downstairs on %s never logged listening within %v", dir, downstairsWait)
	}
	t.Cleanup(d.Stop)
	return d
}

// Stop stops the process with SIGTERM (SIGKILL if it has not exited
// within a bound) and waits for it; stopping it again does nothing.
func (d *Downstairs) Stop() {
	if d.cmd == nil {
		return
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
	case <-time.After(downstairsWait):
		d.cmd.Process.Kill()
		<-d.exited
	}
	d.cmd = nil
}

// Kill ends the process with SIGKILL, as a crash would, and waits for it.
func (d *Downstairs) Kill() {
	if d.cmd == nil {
		return
	}
	d.cmd.Process.Kill()
	<-d.exited
	d.cmd = nil
}
