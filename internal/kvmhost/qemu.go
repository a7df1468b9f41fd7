package kvmhost

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"
)

// kernelCmdline keeps the kernel quiet on its console (ttyS2), stops it
// from rebooting into a loop on panic, and tells /init it is init.
const kernelCmdline = "console=ttyS2 quiet loglevel=3 panic=-1 no_timer_check random.trust_cpu=on tsc=reliable clocksource=tsc " + InitEnv + "=1"

// qemuArgs are QEMU's arguments; fds 3, 4 and 5 are the pipes of ttyS0,
// ttyS1 and ttyS2.
func qemuArgs(k *Kernel, initrd string, cpus int) []string {
	return []string{
		"-nodefaults", "-no-reboot", "-display", "none", "-vga", "none", "-nic", "none",
		"-accel", tcgAccel(cpus), "-cpu", "max", "-smp", fmt.Sprint(cpus), "-m", fmt.Sprint(memoryMiB),
		"-kernel", k.Vmlinux(), "-initrd", initrd, "-append", kernelCmdline,
		"-serial", "file:/dev/fd/3", "-serial", "file:/dev/fd/4", "-serial", "file:/dev/fd/5",
	}
}

// tcgAccel is the TCG mode: a host thread per emulated CPU. Tried on
// 2026-12-03 against the memory corruption seen with two emulated CPUs
// (docs/reliability.md): with both taking turns on one thread
// (thread=single) instance/client's tests ran far slower, past 17 minutes of
// one core without finishing, so the packages waiting for the one
// emulated host would have hit their time limit.
func tcgAccel(int) string { return "tcg,thread=multi" }

// runQEMU boots the machine, streams the binary's output and returns the
// status init reported.
func runQEMU(ctx context.Context, qemu string, k *Kernel, initrd string, o Options) (int, error) {
	type pipe struct{ r, w *os.File }
	var pipes [3]pipe
	for i := range pipes {
		r, w, err := os.Pipe()
		if err != nil {
			return 0, fmt.Errorf("creating serial pipe: %w", err)
		}
		pipes[i] = pipe{r, w}
		defer r.Close()
	}
	var qemuStderr bytes.Buffer
	cpus, err := o.emulatedCPUs()
	if err != nil {
		return 0, err
	}
	cmd := exec.Command(qemu, append(qemuArgs(k, initrd, cpus), qemuNetArgs(o.Network)...)...)
	cmd.ExtraFiles = []*os.File{pipes[0].w, pipes[1].w, pipes[2].w}
	cmd.Stderr = &qemuStderr
	// Pdeathsig fires when the thread that forked QEMU ends, so that thread
	// stays locked to the goroutine that waits for QEMU.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}

	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(signals)

	started := make(chan error, 1)
	exited := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine, after QEMU
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		exited <- cmd.Wait()
	}()
	startErr := <-started
	for _, p := range pipes {
		p.w.Close()
	}
	if startErr != nil {
		return 0, fmt.Errorf("starting %s: %w", qemuBinary, startErr)
	}

	var copies sync.WaitGroup
	copies.Add(3)
	go func() { defer copies.Done(); io.Copy(o.Stdout, pipes[0].r) }()
	go func() { defer copies.Done(); io.Copy(o.Stderr, pipes[1].r) }()
	console := newConsoleLog()
	go func() { defer copies.Done(); console.read(pipes[2].r) }()

	var waitErr, stopErr error
	booted := time.Now()
	check := time.NewTicker(heartbeatEvery)
	defer check.Stop()
	for running := true; running; {
		select {
		case <-check.C:
			quiet, ok := console.silentFor(time.Now())
			switch {
			case !ok && time.Since(booted) > bootLimit:
				cmd.Process.Kill()
				waitErr = <-exited
				stopErr = fmt.Errorf("%s: %w within %v of QEMU's start: QEMU was killed", o.Binary, ErrBootStalled, bootLimit)
			case ok && quiet > stallLimit:
				cmd.Process.Kill()
				waitErr = <-exited
				stopErr = fmt.Errorf("%s: %w: no heartbeat for %v: QEMU was killed", o.Binary, ErrStalled, quiet.Round(time.Second))
				if console.lockedUp() {
					stopErr = fmt.Errorf("%w (%w)", stopErr, ErrLockedUp)
				}
			default:
				continue
			}
		case waitErr = <-exited:
		case <-ctx.Done():
			cmd.Process.Kill()
			waitErr = <-exited
			stopErr = fmt.Errorf("%s %w of %v: QEMU was killed", o.Binary, ErrTimeout, o.Timeout)
			if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
				stopErr = fmt.Errorf("%s: run cancelled: QEMU was killed", o.Binary)
			}
		case sig := <-signals:
			cmd.Process.Kill()
			waitErr = <-exited
			stopErr = fmt.Errorf("%s: interrupted by %v: QEMU was killed", o.Binary, sig)
		}
		running = false
	}
	copies.Wait()
	if stopErr != nil {
		// What the kernel said last is how a hung machine tells why
		// (a lockup, a stall): said before the error.
		if tail := console.tail(); tail != "" {
			fmt.Fprintf(o.Log, "kvmhost: last console lines:\n%s", tail)
		}
		return 0, stopErr
	}
	if status, ok := console.status(); ok {
		return status, nil
	}
	if msg, ok := console.initError(); ok {
		return 0, fmt.Errorf("emulated host could not run %s: %s", o.Binary, msg)
	}
	fmt.Fprintf(o.Log, "kvmhost: last console lines:\n%s", console.tail())
	if qemuStderr.Len() > 0 {
		fmt.Fprintf(o.Log, "kvmhost: QEMU said: %s\n", strings.TrimSpace(qemuStderr.String()))
	}
	if console.panicked() {
		return 0, fmt.Errorf("%w before reporting the exit status of %s (QEMU: %v)", ErrPanicked, o.Binary, waitErr)
	}
	if console.started() {
		return 0, fmt.Errorf("%w of %s (QEMU: %v)", ErrHostExited, o.Binary, waitErr)
	}
	return 0, fmt.Errorf("emulated host stopped before it started %s (QEMU: %v)", o.Binary, waitErr)
}

// consoleLog keeps the guest console's last lines and init's reports.
type consoleLog struct {
	mu       sync.Mutex
	lines    []string // guarded by mu; the last consoleKeep lines
	statusV  int      // guarded by mu
	statusOK bool     // guarded by mu
	errMsg   string   // guarded by mu
	// lastBeat is when init's last heartbeat came (zero before the
	// first); guarded by mu.
	lastBeat time.Time
}

const consoleKeep = 40

func newConsoleLog() *consoleLog { return &consoleLog{} }

func (c *consoleLog) read(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), "\r")
		c.mu.Lock()
		if v, ok := strings.CutPrefix(line, statusPrefix); ok {
			if _, err := fmt.Sscanf(v, "%d", &c.statusV); err == nil {
				c.statusOK = true
			}
		} else if msg, ok := strings.CutPrefix(line, errorPrefix); ok {
			c.errMsg = msg
		} else if strings.HasPrefix(line, heartbeatPrefix) || line == startedLine {
			c.lastBeat = time.Now()
			c.mu.Unlock()
			continue // kept out of the tail, which is for what went wrong
		}
		c.lines = append(c.lines, line)
		if len(c.lines) > consoleKeep {
			c.lines = c.lines[1:]
		}
		c.mu.Unlock()
	}
	io.Copy(io.Discard, r)
}

// started reports whether init said it started the binary.
func (c *consoleLog) started() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return !c.lastBeat.IsZero()
}

// silentFor returns how long before now init's last heartbeat came (its
// start line counts as one), and false before init started the binary.
func (c *consoleLog) silentFor(now time.Time) (time.Duration, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lastBeat.IsZero() {
		return 0, false
	}
	return now.Sub(c.lastBeat), true
}

// lockedUp reports whether the emulated kernel reported a soft lockup, in
// the lines kept.
func (c *consoleLog) lockedUp() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, l := range c.lines {
		if strings.Contains(l, "BUG: soft lockup") {
			return true
		}
	}
	return false
}

// panicked reports whether the emulated kernel said it panicked, in the
// lines kept.
func (c *consoleLog) panicked() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, l := range c.lines {
		if strings.Contains(l, "Kernel panic - not syncing") {
			return true
		}
	}
	return false
}

func (c *consoleLog) status() (int, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.statusV, c.statusOK
}

func (c *consoleLog) initError() (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.errMsg, c.errMsg != ""
}

func (c *consoleLog) tail() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var b strings.Builder
	for _, l := range c.lines {
		b.WriteString("  " + l + "\n")
	}
	return b.String()
}
