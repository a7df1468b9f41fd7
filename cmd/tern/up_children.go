package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// upChild is one process `tern up` started. Its waiter goroutine is locked
// to the OS thread that forked it, so that Pdeathsig (which fires when
// that thread ends) kills the child only when tern up itself dies.
type upChild struct {
	name string
	cmd  *exec.Cmd
	// stopping is set once tern up asked the child to end: its exit is
	// then expected, and not reported.
	stopping atomic.Bool
	// exited is closed once the child was reaped; err is then its
	// Wait result.
	exited chan struct{}
	err    error
}

// startUpChild starts a child in its own process group (a terminal's ^C
// reaches tern up alone, which then stops the children in order) that is
// killed if tern up dies. If it ends before tern up stops it, one line on
// out names it and says how it ended.
func startUpChild(name string, cmd *exec.Cmd, out io.Writer) (*upChild, error) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	c := &upChild{name: name, cmd: cmd, exited: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends after the child
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		c.err = cmd.Wait()
		if !c.stopping.Load() {
			fmt.Fprintf(out, "tern up: %s (pid %d) ended: %s\n", name, cmd.Process.Pid, exitDescription(cmd.ProcessState))
		}
		close(c.exited)
	}()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	return c, nil
}

// stop sends SIGTERM, waits up to grace, then kills; it returns once the
// child was reaped.
func (c *upChild) stop(grace time.Duration) {
	c.stopping.Store(true)
	select {
	case <-c.exited:
		return
	default:
	}
	c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.exited:
	case <-time.After(grace):
		c.cmd.Process.Kill()
		<-c.exited
	}
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
	// An os.Pipe rather than StderrPipe: the reader below reads to the
	// end whenever the child exits, independently of Wait.
	stderr, w, err := os.Pipe()
	if err != nil {
		logFile.Close()
		return nil, "", fmt.Errorf("starting %s: %w", name, err)
	}
	cmd.Stderr = w
	c, err := startUpChild(name, cmd, out)
	w.Close()
	if err != nil {
		stderr.Close()
		logFile.Close()
		return nil, "", err
	}
	listening := make(chan string, 1)
	go func() {
		defer logFile.Close()
		defer stderr.Close()
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Bytes()
			logFile.Write(append(line, '\n'))
			var rec struct {
				Msg  string `json:"msg"`
				Addr string `json:"addr"`
			}
			if json.Unmarshal(line, &rec) == nil && rec.Msg == "listening" && rec.Addr != "" {
				select {
				case listening <- rec.Addr:
				default:
				}
			}
		}
		io.Copy(logFile, stderr)
	}()
	select {
	case addr := <-listening:
		return c, addr, nil
	case <-c.exited:
		return nil, "", fmt.Errorf("starting %s: it exited before listening (%v); see %s", name, c.err, logPath)
	case <-time.After(wait):
		c.stop(time.Second)
		return nil, "", fmt.Errorf("starting %s: not listening after %v; see %s", name, wait, logPath)
	}
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
	stdout, w, err := os.Pipe()
	if err != nil {
		return nil, "", fmt.Errorf("starting %s: %w", name, err)
	}
	cmd.Stdout = w
	c, err := startUpChild(name, cmd, out)
	w.Close()
	if err != nil {
		stdout.Close()
		return nil, "", err
	}
	url := make(chan string, 1)
	go func() {
		defer stdout.Close()
		sc := bufio.NewScanner(stdout)
		if sc.Scan() {
			if u, ok := strings.CutPrefix(sc.Text(), "listening on "); ok {
				url <- u
			}
		}
		io.Copy(io.Discard, stdout)
	}()
	select {
	case u := <-url:
		return c, u, nil
	case <-c.exited:
		return nil, "", fmt.Errorf("starting %s: it exited before listening (%v); see %s", name, c.err, logPath)
	case <-time.After(wait):
		c.stop(time.Second)
		return nil, "", fmt.Errorf("starting %s: it printed no URL in time; see %s", name, logPath)
	}
}
