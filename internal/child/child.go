package child

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

// Process is one started child and the goroutine that reaps it.
type Process struct {
	// Cmd is the command as started.
	Cmd *exec.Cmd
	// onExit runs in the reaper, before exited is closed.
	onExit func(*Process)
	// stopping is set by Stop and Kill: the child's end was asked for.
	stopping atomic.Bool
	// exited is closed once the child was reaped; err is then its Wait
	// result.
	exited chan struct{}
	err    error
}

// Ready is what Start waits for: a line of the child's standard output
// (or standard error) for which Match returns ok, and the value it
// returns is Start's.
type Ready struct {
	// Match finds the line that says the child is ready (ListeningURL,
	// ListeningAddr) and returns the value it carries.
	Match func(line []byte) (value string, ok bool)
	// Stderr says the line comes on standard error; by default it comes
	// on standard output. Start reads that stream itself: the command's
	// own writer for it must be nil.
	Stderr bool
	// Log receives every line of that stream; nil discards them.
	Log io.Writer
	// Wait bounds how long the child may take to print the line; Start
	// then stops it.
	Wait time.Duration
	// What names the line in errors ("its URL", "its listening record").
	What string
}

// Options are Start's choices beyond the command.
type Options struct {
	// Ready, if its Match is set, makes Start wait for the child's
	// ready line.
	Ready Ready
	// OnExit, if set, runs once the child was reaped, before Exited is
	// closed (a parent says there that a child ended unasked).
	OnExit func(*Process)
}

// Start starts cmd in its own process group, killed if this process
// dies, and (when opts.Ready.Match is set) waits for its ready line. It
// returns the process and the line's value; on an error the child is not
// running. The error names cmd's first argument and says "starting".
func Start(cmd *exec.Cmd, opts Options) (*Process, string, error) {
	name := commandName(cmd)
	ready := opts.Ready
	var lines *os.File
	if ready.Match != nil {
		r, w, err := os.Pipe()
		if err != nil {
			return nil, "", fmt.Errorf("starting %s: %w", name, err)
		}
		defer w.Close() // the child holds its own copy
		// An os.Pipe rather than StdoutPipe: the reader reads to the end
		// whenever the child exits, independently of Wait.
		if ready.Stderr {
			cmd.Stderr = w
		} else {
			cmd.Stdout = w
		}
		lines = r
	}
	p, err := start(cmd, opts.OnExit)
	if err != nil {
		if lines != nil {
			lines.Close()
		}
		return nil, "", fmt.Errorf("starting %s: %w", name, err)
	}
	if lines == nil {
		return p, "", nil
	}
	found := make(chan string, 1)
	go scan(lines, ready, found)
	select {
	case v := <-found:
		return p, v, nil
	case <-p.exited:
		return nil, "", fmt.Errorf("starting %s: it exited before it printed %s (%v)", name, ready.What, p.err)
	case <-time.After(ready.Wait):
		p.Stop(time.Second)
		return nil, "", fmt.Errorf("starting %s: it did not print %s within %v", name, ready.What, ready.Wait)
	}
}

// commandName is what errors call cmd: its program and first argument
// ("tern vmm").
func commandName(cmd *exec.Cmd) string {
	name := cmd.Path
	if len(cmd.Args) > 0 {
		name = cmd.Args[0]
	}
	name = name[strings.LastIndexByte(name, '/')+1:]
	if len(cmd.Args) > 1 {
		name += " " + cmd.Args[1]
	}
	return name
}

// start starts cmd from a goroutine that stays locked to its thread and
// reaps the child.
func start(cmd *exec.Cmd, onExit func(*Process)) (*Process, error) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	p := &Process{Cmd: cmd, onExit: onExit, exited: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends after the child
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		p.err = cmd.Wait()
		if p.onExit != nil {
			p.onExit(p)
		}
		close(p.exited)
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return p, nil
}

// scan reads the child's lines to the end, copying them to ready.Log and
// sending the first match's value on found.
func scan(r *os.File, ready Ready, found chan<- string) {
	defer r.Close()
	log := ready.Log
	if log == nil {
		log = io.Discard
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	matched := false
	for sc.Scan() {
		line := sc.Bytes()
		log.Write(append(line, '\n'))
		if matched {
			continue
		}
		if v, ok := ready.Match(line); ok {
			matched = true
			found <- v
		}
	}
	io.Copy(log, r) // a line too long for the scanner: the rest unparsed
}

// Exited is closed once the child was reaped.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// Err is the child's Wait result, once Exited is closed.
func (p *Process) Err() error {
	<-p.exited
	return p.err
}

// Stop sends SIGTERM, waits up to grace, then SIGKILLs; it returns once
// the child was reaped, with its Wait result, wrapped in a "no exit
// within" error if it had to be killed. Stopping a child that ended
// returns how it ended.
func (p *Process) Stop(grace time.Duration) error {
	p.stopping.Store(true)
	select {
	case <-p.exited:
		return p.err
	default:
	}
	p.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
		return p.err
	case <-time.After(grace):
		p.Kill()
		return fmt.Errorf("no exit within %v of SIGTERM: %w", grace, p.err)
	}
}

// Stopping reports whether Stop or Kill was called: an end that was
// asked for, which OnExit need not report.
func (p *Process) Stopping() bool { return p.stopping.Load() }

// Kill SIGKILLs the child, as a crash would, and returns once it was
// reaped.
func (p *Process) Kill() {
	p.stopping.Store(true)
	select {
	case <-p.exited:
		return
	default:
	}
	p.Cmd.Process.Kill()
	<-p.exited
}

// ListeningURL matches the line tern's servers print first on standard
// output, "listening on URL", and returns the URL.
func ListeningURL(line []byte) (string, bool) {
	u, ok := strings.CutPrefix(string(line), "listening on ")
	if !ok || u == "" {
		return "", false
	}
	return u, true
}

// ListeningAddr matches a downstairs' JSON log record
// {"msg":"listening","addr":…} and returns the address.
func ListeningAddr(line []byte) (string, bool) {
	var rec struct {
		Msg  string `json:"msg"`
		Addr string `json:"addr"`
	}
	if json.Unmarshal(line, &rec) != nil || rec.Msg != "listening" || rec.Addr == "" {
		return "", false
	}
	return rec.Addr, true
}
