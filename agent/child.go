package agent

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"time"
)

// child is one process the agent started. Its waiter goroutine is locked
// to the OS thread that forked it, so Pdeathsig (which fires when that
// thread ends) kills the child only when the agent itself dies.
type child struct {
	cmd *exec.Cmd
	// exited is closed once the child was reaped; err is then its Wait
	// result.
	exited chan struct{}
	err    error
}

func startChild(cmd *exec.Cmd) (*child, error) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	c := &child{cmd: cmd, exited: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends after the child
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		c.err = cmd.Wait()
		close(c.exited)
	}()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("starting %s: %w", cmd.Args[1], err)
	}
	return c, nil
}

// stop sends SIGTERM, waits up to grace, then kills; it returns once the
// child was reaped.
func (c *child) stop(grace time.Duration) {
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

// childWait bounds how long a child may take to start listening.
const childWait = 2 * time.Minute

// startVMMProcess runs `tern vmm serve` on ip, logging to log, and
// returns once it printed its URL.
func startVMMProcess(tern, ip, certs string, log io.Writer) (*child, string, error) {
	cmd := exec.Command(tern, "vmm", "serve", "--listen", ip+":0", "--certs", certs)
	cmd.Stderr = log
	stdout, w, err := os.Pipe()
	if err != nil {
		return nil, "", fmt.Errorf("starting vmm: %w", err)
	}
	cmd.Stdout = w
	c, err := startChild(cmd)
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
		return nil, "", fmt.Errorf("starting vmm: it exited before listening: %v", c.err)
	case <-time.After(childWait):
		c.stop(time.Second)
		return nil, "", errors.New("starting vmm: it printed no URL in time")
	}
}

// startDownstairsProcess runs `tern downstairs run` on dir at listen and
// returns once it logged "listening", with its address.
func startDownstairsProcess(tern, dir, listen, certs string, log io.Writer) (*child, string, error) {
	cmd := exec.Command(tern, "downstairs", "run", "--dir", dir, "--listen", listen, "--certs", certs)
	stderr, w, err := os.Pipe()
	if err != nil {
		return nil, "", fmt.Errorf("starting downstairs: %w", err)
	}
	cmd.Stderr = w
	c, err := startChild(cmd)
	w.Close()
	if err != nil {
		stderr.Close()
		return nil, "", err
	}
	listening := make(chan string, 1)
	go func() {
		defer stderr.Close()
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Bytes()
			log.Write(append(line, '\n'))
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
		io.Copy(log, stderr)
	}()
	select {
	case addr := <-listening:
		return c, addr, nil
	case <-c.exited:
		return nil, "", fmt.Errorf("starting downstairs on %s: it exited before listening: %v", dir, c.err)
	case <-time.After(childWait):
		c.stop(time.Second)
		return nil, "", fmt.Errorf("starting downstairs on %s: not listening in time", dir)
	}
}
