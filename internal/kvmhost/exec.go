package kvmhost

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Emulated machine: one vCPU under TCG (CPUsEnv may ask for more) and 6
// GiB of RAM (QEMU allocates it as the guest touches it). With 2 GiB the
// emulated host ran out of memory in a Linux guest's migration: each
// page the race detector sees a syscall read or write (page copy into
// and out of guest RAM) costs shadow memory several times its size, on
// the source and on the target. With two, the emulated kernel locked up about once in ten
// runs of vmm/kvm's tests (2026-12-02: "soft lockup - CPU#0 stuck for
// 44s! [kthreadd:2]" and the same of CPU#1 in init, both spinning, until
// the run's limit); with one, twenty runs in a row passed. Guests inside
// may still have several vCPUs: KVM runs them as threads.
const (
	qemuBinary = "qemu-system-x86_64"
	memoryMiB  = 6144
	vcpus      = 1
)

// CPUsEnv sets the emulated machine's CPUs (1 to 4; default 1). A Linux
// guest inside stalls the whole machine with one: while it runs, the
// emulated kernel's only CPU does nothing else (no heartbeat for 90 s,
// twice in two runs of TestLinuxUserlandRunsItsShell), so the Linux
// guests' tests ask for two.
const CPUsEnv = "TERN_KVMHOST_CPUS"

// emulatedCPUs returns the CPUs asked for: o.CPUs, else CPUsEnv's
// count, else vcpus.
func (o *Options) emulatedCPUs() (int, error) {
	if o.CPUs != 0 {
		if o.CPUs < 1 || o.CPUs > 4 {
			return 0, fmt.Errorf("kvmhost: %d CPUs asked for; want 1 to 4", o.CPUs)
		}
		return o.CPUs, nil
	}
	s := os.Getenv(CPUsEnv)
	if s == "" {
		return vcpus, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > 4 {
		return 0, fmt.Errorf("parsing %s=%q: want 1 to 4", CPUsEnv, s)
	}
	return n, nil
}

// TimeoutEnv sets the default wall-clock limit of a run (a Go duration).
const TimeoutEnv = "TERN_KVMHOST_TIMEOUT"

// DefaultTimeout is the limit when neither a flag nor TimeoutEnv sets one.
const DefaultTimeout = 20 * time.Minute

// ErrTimeout reports a run that did not finish within its limit; QEMU was
// killed.
var ErrTimeout = errors.New("did not finish within the time limit")

// ErrStalled reports a machine that stopped while the binary ran: init's
// heartbeat did not come for stallLimit; QEMU was killed. It is not
// retried: a guest of the binary's may have caused it.
var ErrStalled = errors.New("the emulated host stalled")

// ErrBootStalled reports a machine that went silent before the binary
// started: init did not say it started the binary within bootLimit of
// QEMU's start; QEMU was killed. Nothing of the binary's ran.
var ErrBootStalled = errors.New("the emulated host did not start the binary")

// ErrPanicked reports a machine whose kernel panicked (its console said
// "Kernel panic - not syncing") before the binary's status came.
var ErrPanicked = errors.New("the emulated host's kernel panicked")

// ErrLockedUp reports a machine that stalled while the binary ran (see
// ErrStalled) after its own kernel reported a lockup on its console ("BUG:
// soft lockup"): the control experiment of 2026-12-07 saw exactly that
// with QEMU as the VMM inside (docs/reliability.md), so it is the
// emulated host's own failure whatever the binary ran.
var ErrLockedUp = errors.New("the emulated host's kernel locked up")

// ErrHostExited reports a QEMU that exited on its own (crashed, or reset
// its machine, which -no-reboot turns into an exit) without the binary's
// status and without a kernel panic on the console.
var ErrHostExited = errors.New("QEMU exited without the binary's exit status")

// hostFault reports whether err proves the emulated host failed on its
// own, so that running the binary again hides nothing of the binary's:
// its kernel panicked or reported a lockup, QEMU exited on its own, or the
// machine went silent before the binary started. A stall while the binary
// ran without the kernel's word for it is not one (a guest it ran may be
// the cause), nor is a time limit.
func hostFault(err error) bool {
	return errors.Is(err, ErrPanicked) || errors.Is(err, ErrHostExited) || errors.Is(err, ErrBootStalled) || errors.Is(err, ErrLockedUp)
}

// heartbeatEvery is how often init prints its heartbeat, and how often
// the host looks for it.
const heartbeatEvery = 5 * time.Second

// stallLimit is how long a machine may print no heartbeat before it
// counts as stalled: eighteen beats missed, far beyond a busy machine's
// delays.
const stallLimit = 90 * time.Second

// bootLimit is how long after QEMU's start init has to say it started the
// binary: a boot takes 5-8 s on two busy cores (kernel and modules), so
// a machine silent for this long never will.
const bootLimit = 4 * time.Minute

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
	// CPUs is the emulated machine's CPUs, 1 to 4; 0 means CPUsEnv or
	// one.
	CPUs int
	// RetryStall boots the machine once more, with a Timeout of its own,
	// when the first failed on its own (hostFault: its kernel panicked,
	// QEMU exited, or it went silent before the binary started), saying
	// so with NoteRetry: for a binary that may run twice, as a test
	// binary may.
	RetryStall bool
	// Stdout and Stderr receive the binary's output as it is written;
	// nil means this process's.
	Stdout, Stderr io.Writer
	// Network, when set, gives the emulated host a network card on QEMU
	// user networking with forwards from the host's loopback.
	Network *Network
	// Log receives kvmhost's own progress (a kernel fetch) and, on failure,
	// the guest console's last lines; nil means os.Stderr.
	Log io.Writer
	// WaitLog receives the two lines of a wait for another emulated host
	// on this machine ("kvmhost: waiting for another emulated test host
	// …", then "kvmhost: the other emulated host finished after Ns"); nil
	// means Log.
	WaitLog io.Writer
	// OnMachine, when set, is called once this Exec holds the machine's
	// one emulated host, after any wait for another and before the boot:
	// a caller that bounds the boot starts its clock there.
	OnMachine func()
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
	// The time limit starts once this host has the machine: the wait for
	// another emulated host is bounded by the caller's ctx only.
	release, err := acquireMachine(ctx, o.WaitLog)
	if err != nil {
		return 0, err
	}
	defer release()
	if o.OnMachine != nil {
		o.OnMachine()
	}
	machineCtx := ctx
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
	status, err := runQEMU(ctx, qemu, kernel, initrd, o)
	if !hostFault(err) || !o.RetryStall {
		return status, err
	}
	// The emulated host failed on its own, not the binary: one more
	// boot, with a time limit of its own; a second is the caller's to
	// see.
	NoteRetry(o.Log, "kvmhost: %v; booting the emulated host again to run %s once more", err, filepath.Base(o.Binary))
	ctx, cancel = context.WithTimeout(machineCtx, o.Timeout)
	defer cancel()
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
	if o.WaitLog == nil {
		o.WaitLog = o.Log
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
