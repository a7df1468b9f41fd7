package kvmhost

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Emulated machine: two vCPUs under multi-threaded TCG and 2 GiB of RAM.
const (
	qemuBinary = "qemu-system-x86_64"
	memoryMiB  = 2048
	vcpus      = 2
)

// TimeoutEnv sets the default wall-clock limit of a run (a Go duration).
const TimeoutEnv = "TERN_KVMHOST_TIMEOUT"

// DefaultTimeout is the limit when neither a flag nor TimeoutEnv sets one.
const DefaultTimeout = 20 * time.Minute

// ErrTimeout reports a run that did not finish within its limit; QEMU was
// killed.
var ErrTimeout = errors.New("did not finish within the time limit")

// File is a host file or directory carried into the emulated host.
type File struct {
	// Host is the path on the host.
	Host string
	// Guest is the absolute path inside; empty means Host made absolute.
	Guest string
}

// ParseFile parses HOST_PATH[:GUEST_PATH].
func ParseFile(s string) (File, error) {
	host, guest, _ := strings.Cut(s, ":")
	if host == "" {
		return File{}, fmt.Errorf("parsing --file %q: no host path", s)
	}
	if guest != "" && !filepath.IsAbs(guest) {
		return File{}, fmt.Errorf("parsing --file %q: guest path %q is not absolute", s, guest)
	}
	return File{Host: host, Guest: guest}, nil
}

// Options describe one run of a binary in the emulated host.
type Options struct {
	// Binary is the program to run: a path, or a name looked up in PATH.
	Binary string
	// Args follow argv[0] (which is Binary as given).
	Args []string
	// Files are carried in beside the binary and its libraries.
	Files []File
	// Env is the binary's environment; nil means this process's.
	Env []string
	// Dir is the working directory, recreated inside; "" means the current
	// one. Its testdata directory, if any, is carried in (go test reads
	// its files from there).
	Dir string
	// Timeout is the wall-clock limit; 0 means TimeoutEnv or
	// DefaultTimeout.
	Timeout time.Duration
	// Stdout and Stderr receive the binary's output as it is written;
	// nil means this process's.
	Stdout, Stderr io.Writer
	// Log receives kvmhost's own progress (a kernel fetch) and, on failure,
	// the guest console's last lines; nil means os.Stderr.
	Log io.Writer
}

// Exec boots the emulated host, runs the binary in it and returns its exit
// status. The error is non-nil when the binary's status could not be had:
// a missing binary or kernel, a QEMU failure, the time limit (ErrTimeout),
// or SIGINT/SIGTERM to this process. QEMU never outlives Exec: it is
// killed by pid on every such path, and by the kernel (Pdeathsig) if this
// process dies.
func Exec(ctx context.Context, o Options) (int, error) {
	if err := o.defaults(); err != nil {
		return 0, err
	}
	binary, err := resolveBinary(o.Binary)
	if err != nil {
		return 0, err
	}
	qemu, err := exec.LookPath(qemuBinary)
	if err != nil {
		return 0, fmt.Errorf("%s not found in PATH (install qemu-system-x86)", qemuBinary)
	}
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	kernel, err := EnsureKernel(ctx, o.Log)
	if err != nil {
		if ctx.Err() != nil {
			return 0, fmt.Errorf("%s %w of %v while fetching the kernel", o.Binary, ErrTimeout, o.Timeout)
		}
		return 0, err
	}
	work, err := os.MkdirTemp("", "kvmhost-")
	if err != nil {
		return 0, fmt.Errorf("creating work directory: %w", err)
	}
	defer os.RemoveAll(work)
	initrd := filepath.Join(work, "initrd.cpio")
	if err := buildInitramfs(initrd, kernel, binary, o); err != nil {
		return 0, err
	}
	return runQEMU(ctx, qemu, kernel, initrd, o)
}

func (o *Options) defaults() error {
	if o.Binary == "" {
		return errors.New("no binary to run")
	}
	if o.Env == nil {
		o.Env = os.Environ()
	}
	if o.Dir == "" {
		d, err := os.Getwd()
		if err != nil {
			return fmt.Errorf("finding working directory: %w", err)
		}
		o.Dir = d
	}
	if o.Timeout == 0 {
		o.Timeout = DefaultTimeout
		if s := os.Getenv(TimeoutEnv); s != "" {
			d, err := time.ParseDuration(s)
			if err != nil || d <= 0 {
				return fmt.Errorf("parsing %s=%q: want a positive duration such as 10m", TimeoutEnv, s)
			}
			o.Timeout = d
		}
	}
	if o.Stdout == nil {
		o.Stdout = os.Stdout
	}
	if o.Stderr == nil {
		o.Stderr = os.Stderr
	}
	if o.Log == nil {
		o.Log = os.Stderr
	}
	return nil
}

// resolveBinary returns the absolute path of the binary to run.
func resolveBinary(name string) (string, error) {
	p := name
	if !strings.Contains(name, "/") {
		lp, err := exec.LookPath(name)
		if err != nil {
			return "", fmt.Errorf("%s: not found in PATH", name)
		}
		p = lp
	}
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", fmt.Errorf("%s: %w", name, err)
	}
	st, err := os.Stat(abs)
	if err != nil {
		return "", fmt.Errorf("%s: %w", name, errors.Unwrap(err))
	}
	if !st.Mode().IsRegular() || st.Mode().Perm()&0o111 == 0 {
		return "", fmt.Errorf("%s: not an executable file", name)
	}
	return abs, nil
}

// guestEnv is the binary's environment inside: the given one, with TMPDIR
// pointing at the guest's tmpfs and InsideEnv set.
func guestEnv(env []string) []string {
	out := make([]string, 0, len(env)+2)
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if k == "TMPDIR" || k == InsideEnv || k == InitEnv {
			continue
		}
		out = append(out, kv)
	}
	return append(out, "TMPDIR=/tmp", InsideEnv+"=1")
}

// buildInitramfs writes the cached modules archive followed by a second
// cpio archive (the kernel unpacks concatenated archives in order) holding
// /init, the binary, every shared library either needs, the extra files,
// the working directory's testdata and the run spec.
func buildInitramfs(dst string, k *Kernel, binary string, o Options) error {
	f, err := os.Create(dst)
	if err != nil {
		return fmt.Errorf("creating initramfs: %w", err)
	}
	defer f.Close()
	base, err := os.Open(k.ModulesCPIO())
	if err != nil {
		return fmt.Errorf("reading cached modules: %w", err)
	}
	_, err = io.Copy(f, base)
	base.Close()
	if err != nil {
		return fmt.Errorf("writing initramfs: %w", err)
	}
	bw := bufio.NewWriterSize(f, 1<<20)
	w := newCPIOWriter(bw)
	added := map[string]bool{}
	add := func(host, guest string) error {
		if added[guest] {
			return nil
		}
		added[guest] = true
		return addHostPath(w, host, guest)
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding own executable for /init: %w", err)
	}
	self, _ = filepath.EvalSymlinks(self)
	resolved, _ := filepath.EvalSymlinks(binary)
	execs := []string{binary}
	if self == resolved {
		w.Symlink("/init", binary)
	} else {
		if err := add(self, initExePath); err != nil {
			return err
		}
		w.Symlink("/init", initExePath)
		execs = append(execs, self)
	}
	if err := add(binary, binary); err != nil {
		return err
	}
	libs := newLibResolver()
	for _, e := range execs {
		deps, err := libs.Dependencies(e)
		if err != nil {
			return err
		}
		for _, d := range deps {
			if err := add(d, d); err != nil {
				return err
			}
		}
	}
	for _, file := range o.Files {
		guest := file.Guest
		if guest == "" {
			abs, err := filepath.Abs(file.Host)
			if err != nil {
				return fmt.Errorf("carrying %s: %w", file.Host, err)
			}
			guest = abs
		}
		if err := add(file.Host, guest); err != nil {
			return err
		}
		if st, err := os.Stat(file.Host); err == nil && st.Mode().IsRegular() && st.Mode().Perm()&0o111 != 0 {
			// A carried executable (a tern binary for the tests) needs
			// its libraries too.
			deps, err := libs.Dependencies(file.Host)
			if err != nil {
				return err
			}
			for _, d := range deps {
				if err := add(d, d); err != nil {
					return err
				}
			}
		}
	}
	w.Dir(o.Dir)
	if td := filepath.Join(o.Dir, "testdata"); isDir(td) {
		if err := add(td, td); err != nil {
			return err
		}
	}
	spec, _ := json.Marshal(runSpec{
		Path: binary,
		Argv: append([]string{o.Binary}, o.Args...),
		Env:  guestEnv(o.Env),
		Dir:  o.Dir,
	})
	w.File(runSpecPath, 0o644, int64(len(spec)), bytes.NewReader(spec))
	if err := w.Close(); err != nil {
		return fmt.Errorf("writing initramfs: %w", err)
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("writing initramfs: %w", err)
	}
	return f.Close()
}

func isDir(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.IsDir()
}

// addHostPath adds host file or directory tree host at guest, following
// symbolic links.
func addHostPath(w *cpioWriter, host, guest string) error {
	st, err := os.Stat(host)
	if err != nil {
		return fmt.Errorf("carrying %s: %w", host, errors.Unwrap(err))
	}
	if st.IsDir() {
		w.Dir(guest)
		entries, err := os.ReadDir(host)
		if err != nil {
			return fmt.Errorf("carrying %s: %w", host, err)
		}
		for _, e := range entries {
			if err := addHostPath(w, filepath.Join(host, e.Name()), filepath.Join(guest, e.Name())); err != nil {
				return err
			}
		}
		return nil
	}
	if !st.Mode().IsRegular() {
		return nil // sockets, devices: nothing to carry
	}
	f, err := os.Open(host)
	if err != nil {
		return fmt.Errorf("carrying %s: %w", host, err)
	}
	defer f.Close()
	w.File(guest, uint32(st.Mode().Perm()), st.Size(), f)
	return w.err
}

// kernelCmdline keeps the kernel quiet on its console (ttyS2), stops it
// from rebooting into a loop on panic, and tells /init it is init.
const kernelCmdline = "console=ttyS2 quiet loglevel=3 panic=-1 no_timer_check random.trust_cpu=on " + InitEnv + "=1"

// qemuArgs are QEMU's arguments; fds 3, 4 and 5 are the pipes of ttyS0,
// ttyS1 and ttyS2.
func qemuArgs(k *Kernel, initrd string) []string {
	return []string{
		"-nodefaults", "-no-reboot", "-display", "none", "-vga", "none", "-nic", "none",
		"-accel", "tcg,thread=multi", "-cpu", "max", "-smp", fmt.Sprint(vcpus), "-m", fmt.Sprint(memoryMiB),
		"-kernel", k.Vmlinux(), "-initrd", initrd, "-append", kernelCmdline,
		"-serial", "file:/dev/fd/3", "-serial", "file:/dev/fd/4", "-serial", "file:/dev/fd/5",
	}
}

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
	cmd := exec.Command(qemu, qemuArgs(k, initrd)...)
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
	select {
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
	copies.Wait()
	if stopErr != nil {
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
	return 0, fmt.Errorf("emulated host stopped without reporting the exit status of %s (QEMU: %v)", o.Binary, waitErr)
}

// consoleLog keeps the guest console's last lines and init's reports.
type consoleLog struct {
	mu       sync.Mutex
	lines    []string // guarded by mu; the last consoleKeep lines
	statusV  int      // guarded by mu
	statusOK bool     // guarded by mu
	errMsg   string   // guarded by mu
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
		}
		c.lines = append(c.lines, line)
		if len(c.lines) > consoleKeep {
			c.lines = c.lines[1:]
		}
		c.mu.Unlock()
	}
	io.Copy(io.Discard, r)
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
