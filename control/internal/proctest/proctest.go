// Package proctest runs the tern processes of the control plane's
// multi-process tests (tern control, tern agent, tern ctl) and keeps what
// each printed, for the tests in control/multihost and control/quorum.
package proctest

import (
	"bytes"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"tern/internal/child"
)

// StopWait bounds how long Stop waits after SIGTERM before it SIGKILLs.
const StopWait = 3 * time.Minute

// StartWait bounds how long a process may take to print its URL.
const StartWait = 3 * time.Minute

// Proc is one tern process of a test.
type Proc struct {
	Name string
	Cmd  *exec.Cmd
	proc *child.Process
	// URL is what the process printed after "listening on ".
	URL string
	// Exited receives the process's exit once.
	Exited chan error
	stderr *LockedBuffer
	once   sync.Once
}

// Stderr is what the process wrote to its standard error so far.
func (p *Proc) Stderr() string { return p.stderr.String() }

// LockedBuffer is a bytes.Buffer a process writes while a test reads it.
type LockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *LockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *LockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Start runs bin args with env added to this process's environment,
// inside network namespace ns ("": this one) by `ip netns exec` (which
// execs bin in place: the process is bin's own), and waits (up to
// StartWait) for its line "listening on URL". The process is stopped
// when t ends, and its stderr's tail logged if t failed.
func Start(t testing.TB, bin, ns, name string, env []string, args ...string) *Proc {
	t.Helper()
	cmd := exec.Command(bin, args...)
	if ns != "" {
		cmd = exec.Command("ip", append([]string{"netns", "exec", ns, bin}, args...)...)
	}
	cmd.Env = append(os.Environ(), env...)
	p := &Proc{Name: name, Cmd: cmd, stderr: &LockedBuffer{}, Exited: make(chan error, 1)}
	cmd.Stderr = p.stderr
	proc, url, err := child.Start(cmd, child.Options{Ready: child.Ready{Match: child.ListeningURL, Wait: StartWait, What: "its URL"}})
	if err != nil {
		t.Fatalf("%s: %v\n%s", name, err, p.stderr)
	}
	p.proc, p.URL = proc, url
	go func() { p.Exited <- proc.Err() }()
	t.Cleanup(func() {
		p.Stop()
		if t.Failed() {
			t.Logf("%s stderr (tail):\n%s", name, Tail(p.stderr.String(), 4000))
		}
	})
	return p
}

// Tail is the last n bytes of s.
func Tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// Stop sends SIGTERM and waits (SIGKILL after StopWait).
func (p *Proc) Stop() {
	p.once.Do(func() { p.proc.Stop(StopWait) })
}

// Kill SIGKILLs the process and waits for it to exit.
func (p *Proc) Kill() {
	p.once.Do(p.proc.Kill)
}

// Reaped records that the test already received the process's exit from
// Exited, so Stop and Kill have nothing left to do.
func (p *Proc) Reaped() { p.once.Do(func() {}) }
