package kvmtest

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"tern/internal/kvmhost"
	"tern/vmm/kvm"
)

// ModeEnv chooses between /dev/kvm and the emulated host (see the package
// doc).
const ModeEnv = "TERN_KVMHOST"

// TernEnv carries the path of the tern binary built by WithTern.
const TernEnv = "TERN_KVMTEST_TERN"

// InsideBanner is printed once by a test binary inside the emulated host.
const InsideBanner = "kvmhost: running inside the emulated test host"

// Option changes what Main does.
type Option func(*config)

type config struct {
	tern bool
	// siblings are the sibling binaries built beside tern (WithTern).
	siblings []string
	prepare  []func() ([]kvmhost.File, func(), error)
	cpus     int
	// ownRun and ownCPUs are WithEmulatedCPUsFor's.
	ownRun  string
	ownCPUs int
}

// WithEmulatedCPUs gives the emulated host n CPUs (kvmhost.Options.CPUs)
// when the tests run there, for a package whose guests keep a CPU busy
// while the host side must progress too: with one emulated CPU a live
// repair beside a busy guest visited no extent in two minutes, and a
// Linux guest stalled the machine (kvmhost.CPUsEnv).
func WithEmulatedCPUs(n int) Option {
	return func(c *config) { c.cpus = n }
}

// WithEmulatedCPUsFor runs the top-level tests matching run (a
// -test.run pattern without '/') in an emulated host of their own with
// cpus CPUs, and the rest of the package in one with WithEmulatedCPUs's
// count (default 1), when the whole package goes to the emulated host.
// Two emulated CPUs run on two host threads (multi-threaded TCG), where
// migrated guests have triple-faulted and the emulated kernel has
// panicked (docs/reliability.md); only the tests that need a second CPU
// should run there. With -test.run given, every chosen test runs in the
// cpus-CPU host, as with WithEmulatedCPUs(cpus).
func WithEmulatedCPUsFor(cpus int, run string) Option {
	return func(c *config) { c.ownCPUs, c.ownRun = cpus, run }
}

// WithPrepare runs prepare on the host before the tests run, here or in
// the emulated host: the files it returns are carried into the emulated
// host at the same paths, and cleanup (may be nil) runs after the tests.
// It passes what it made to the tests through the environment
// (os.Setenv), which the emulated host inherits. An error stops Main.
func WithPrepare(prepare func() (files []kvmhost.File, cleanup func(), err error)) Option {
	return func(c *config) { c.prepare = append(c.prepare, prepare) }
}

// runPrepare runs c's prepare functions and returns their files and one
// cleanup for all.
func (c config) runPrepare() ([]kvmhost.File, func(), error) {
	var files []kvmhost.File
	var cleanups []func()
	cleanup := func() {
		for _, f := range slices.Backward(cleanups) {
			f()
		}
	}
	for _, p := range c.prepare {
		fs, cl, err := p()
		if cl != nil {
			cleanups = append(cleanups, cl)
		}
		if err != nil {
			cleanup()
			return nil, nil, fmt.Errorf("preparing the tests: %w", err)
		}
		files = append(files, fs...)
	}
	return files, cleanup, nil
}

// WithTern builds tern on the host before the tests run and carries it
// into the emulated host; Tern returns its path. siblings are the sibling
// binaries the tests run through tern ("tern-control" for tern control,
// "tern-agent" for tern agent), built beside it.
func WithTern(siblings ...string) Option {
	return func(c *config) { c.tern, c.siblings = true, siblings }
}

// state is set once by Main, before any test runs, and only read after.
var state struct {
	mainRan  bool
	inside   bool
	probeErr error
	tern     string
}

// Main runs the tests of m where KVM is usable and exits with their
// status; it never returns.
func Main(m *testing.M, opts ...Option) {
	if kvmhost.IsInit() {
		kvmhost.RunInit() // this binary is the emulated host's /init
	}
	var c config
	for _, o := range opts {
		o(&c)
	}
	state.mainRan = true
	if kvmhost.InsideEmulatedHost() {
		fmt.Println(InsideBanner)
		state.inside = true
		state.probeErr = kvm.Probe()
		state.tern = os.Getenv(TernEnv)
		os.Exit(m.Run())
	}
	if fuzzing(os.Args[1:]) {
		// A fuzz target decodes bytes and needs no KVM: fuzzing stays
		// on the host, where the coordinator's workers and the corpus
		// under testdata/fuzz are, whatever ModeEnv says (inside the
		// emulated host each 10 s of fuzzing cost a boot, and a
		// reproducer it wrote would stay inside).
		state.probeErr = kvm.Probe()
		os.Exit(m.Run())
	}
	mode := os.Getenv(ModeEnv)
	switch mode {
	case "", "auto", "always", "never":
	default:
		fmt.Fprintf(os.Stderr, "kvmtest: %s=%q: want auto, always or never\n", ModeEnv, mode)
		os.Exit(2)
	}
	if mode != "always" {
		state.probeErr = kvm.Probe()
		if state.probeErr == nil || mode == "never" {
			os.Exit(runHere(m, c))
		}
	}
	os.Exit(reexec(c))
}

// runHere runs the tests in this process.
func runHere(m *testing.M, c config) int {
	_, cleanup, err := c.runPrepare()
	if err != nil {
		fmt.Fprintf(os.Stderr, "kvmtest: %v\n", err)
		return 1
	}
	defer cleanup()
	if c.tern {
		dir, path, err := buildTern(c.siblings)
		if err != nil {
			fmt.Fprintf(os.Stderr, "kvmtest: %v\n", err)
			return 1
		}
		defer os.RemoveAll(dir)
		state.tern = path
	}
	return m.Run()
}

// reexec runs this test binary with the same arguments in the emulated
// host and returns its exit status.
func reexec(c config) int {
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintf(os.Stderr, "kvmtest: finding the test binary: %v\n", err)
		return 1
	}
	files, cleanup, err := c.runPrepare()
	if err != nil {
		fmt.Fprintf(os.Stderr, "kvmtest: %v\n", err)
		return 1
	}
	defer cleanup()
	o := kvmhost.Options{Binary: self, Args: os.Args[1:], Timeout: testTimeout(os.Args[1:]), Files: files, RetryStall: true, CPUs: c.cpus}
	if c.tern {
		dir, path, err := buildTern(c.siblings)
		if err != nil {
			fmt.Fprintf(os.Stderr, "kvmtest: %v\n", err)
			return 1
		}
		defer os.RemoveAll(dir)
		o.Files = append(o.Files, kvmhost.File{Host: path})
		for _, s := range c.siblings {
			o.Files = append(o.Files, kvmhost.File{Host: filepath.Join(dir, s)})
		}
		o.Env = append(os.Environ(), TernEnv+"="+path)
	}
	var runs []kvmhost.Options
	switch _, chosen := flagValue(o.Args, "test.run"); {
	case c.ownRun == "":
		runs = []kvmhost.Options{o}
	case chosen:
		o.CPUs = c.ownCPUs
		runs = []kvmhost.Options{o}
	default:
		rest, own := o, o
		skip, _ := flagValue(o.Args, "test.skip")
		rest.Args = withFlag(o.Args, "test.skip", joinPatterns(skip, c.ownRun))
		own.Args, own.CPUs = withFlag(o.Args, "test.run", c.ownRun), c.ownCPUs
		runs = []kvmhost.Options{rest, own}
		fmt.Printf("kvmtest: the tests matching %q run in an emulated host of %d CPUs of their own, after the rest\n", c.ownRun, c.ownCPUs)
	}
	status := 0
	for _, r := range runs {
		if st := execRetryingEmulatorFaults(r); status == 0 {
			status = st
		}
	}
	return status
}

// ConsoleStall is in the error of a Linux test whose guest's console
// stopped answering: a command's end never came (linuxtest's Shell.Run),
// or a line it waited for, such as the userland's ready line, never came
// (Shell.WaitFor). Such a test fails and is never run again: a guest that
// stopped may be tern's bug. Its error carries the instance's error (a
// crash report when the guest faulted).
const ConsoleStall = "the guest's console stopped answering"

// EmulatorTripleFault is the signature of the one guest failure that the
// control experiment of 2026-12-07 (instance/migrationcontrol,
// docs/reliability.md) saw with QEMU as the VMM inside the emulated host
// as with tern: a guest vCPU's triple fault, which SVM reports after
// resetting the vCPU, so the crash report shows it at the reset vector.
// On /dev/kvm, where no vCPU is reset before the report, it never reads
// so.
const EmulatorTripleFault = "at rip 0xfff0: guest triple-faulted (KVM_EXIT_SHUTDOWN)"

// execRetryingEmulatorFaults runs o in the emulated host and returns the
// test binary's exit status. When it fails and every top-level test that
// failed has EmulatorTripleFault in its output, those tests run once
// more, alone, in a new emulated host, saying so (kvmhost.NoteRetry); the
// second run's status is the result. Any other failure is final.
func execRetryingEmulatorFaults(o kvmhost.Options) int {
	stdout := o.Stdout
	if stdout == nil {
		stdout = os.Stdout
	}
	var out strings.Builder
	first := o
	first.Stdout = io.MultiWriter(stdout, &out)
	st := execOnce(first)
	if st == 0 {
		return st
	}
	faulted := testsFailedWith(out.String(), EmulatorTripleFault)
	if len(faulted) == 0 {
		return st
	}
	for i, name := range faulted {
		faulted[i] = regexp.QuoteMeta(name)
	}
	again := o
	again.Args = withFlag(o.Args, "test.run", "^("+strings.Join(faulted, "|")+")$")
	kvmhost.NoteRetry(stdout, "kvmtest: %s failed with a guest triple fault at the reset vector in the emulated host (the signature seen under QEMU too: docs/reliability.md); running them once more",
		strings.Join(faulted, ", "))
	return execOnce(again)
}

// testsFailedWith returns the top-level tests that failed in a test
// binary's output, when there are some and each one's output holds sig;
// otherwise nil. A test's output is what came after the previous
// top-level result line up to the end of the indented lines under its own
// "--- FAIL:" line, which holds its log with or without -test.v.
func testsFailedWith(out, sig string) []string {
	lines := strings.Split(out, "\n")
	var failed []string
	from := 0
	for i := 0; i < len(lines); i++ {
		rest, ok := strings.CutPrefix(lines[i], "--- FAIL: ")
		if !ok {
			if strings.HasPrefix(lines[i], "--- ") {
				from = i + 1
			}
			continue
		}
		name, _, _ := strings.Cut(rest, " ")
		end := i + 1
		for end < len(lines) && (strings.HasPrefix(lines[end], " ") || strings.HasPrefix(lines[end], "\t")) {
			end++
		}
		if !strings.Contains(strings.Join(lines[from:end], "\n"), sig) {
			return nil // a failure of another kind: running again hides it
		}
		failed = append(failed, name)
		from, i = end, end-1
	}
	return failed
}

// execOnce runs o in the emulated host and returns the binary's status.
// The emulated host is booted once more only when it failed on its own
// (kvmhost.Options.RetryStall); a test that failed is never run again.
func execOnce(o kvmhost.Options) int {
	stdout := o.Stdout
	if stdout == nil {
		stdout = os.Stdout
	}
	var out strings.Builder
	o.Stdout = io.MultiWriter(stdout, &out)
	defer func() { kvmhost.CopyRetries(out.String()) }()
	st, err := kvmhost.Exec(context.Background(), o)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kvmtest: running the tests in the emulated test host: %v\n", err)
		return 1
	}
	return st
}

// flagValue returns the value of -name=V or -name V in args.
func flagValue(args []string, name string) (string, bool) {
	for i, a := range args {
		if v, ok := strings.CutPrefix(a, "-"+name+"="); ok {
			return v, true
		}
		if a == "-"+name && i+1 < len(args) {
			return args[i+1], true
		}
	}
	return "", false
}

// withFlag returns args with -name set to v, any earlier setting removed.
func withFlag(args []string, name, v string) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		switch a := args[i]; {
		case strings.HasPrefix(a, "-"+name+"="):
		case a == "-"+name && i+1 < len(args):
			i++
		default:
			out = append(out, a)
		}
	}
	return append(out, "-"+name+"="+v)
}

// joinPatterns is a pattern matching either of a (may be empty) and b.
func joinPatterns(a, b string) string {
	if a == "" {
		return b
	}
	return "(" + a + ")|(" + b + ")"
}

// fuzzing reports whether args make the test binary fuzz (-test.fuzz
// with a pattern, as go test -fuzz passes it) or be a fuzzing worker.
func fuzzing(args []string) bool {
	for i, a := range args {
		switch {
		case a == "-test.fuzzworker" || strings.HasPrefix(a, "-test.fuzzworker="):
			return true
		case strings.HasPrefix(a, "-test.fuzz="):
			return strings.TrimPrefix(a, "-test.fuzz=") != ""
		case a == "-test.fuzz" && i+1 < len(args):
			return args[i+1] != ""
		}
	}
	return false
}

// bootAllowance is the time the emulated host needs beyond the tests'
// own -test.timeout: fetching nothing, booting and loading KVM.
const bootAllowance = 3 * time.Minute

// testTimeout returns -test.timeout plus bootAllowance, or 0 (kvmhost's
// default) when TERN_KVMHOST_TIMEOUT is set or the flag is absent or 0.
func testTimeout(args []string) time.Duration {
	if os.Getenv(kvmhost.TimeoutEnv) != "" {
		return 0 // the explicit limit wins
	}
	if v, ok := flagValue(args, "test.timeout"); ok {
		if d, err := time.ParseDuration(v); err == nil && d > 0 {
			return d + bootAllowance
		}
	}
	return 0
}

// buildTern builds tern/cmd/tern into a new temporary directory, with
// the sibling binaries named (tern-control, tern-agent: what tern control
// and tern agent run) beside it.
func buildTern(siblings []string) (dir, path string, err error) {
	dir, err = os.MkdirTemp("", "kvmtest-tern-")
	if err != nil {
		return "", "", fmt.Errorf("building tern: %w", err)
	}
	path = filepath.Join(dir, "tern")
	pkgs := []string{"tern/cmd/tern"}
	for _, s := range siblings {
		pkgs = append(pkgs, "tern/cmd/"+s)
	}
	out, err := exec.Command("go", append([]string{"build", "-o", dir + "/"}, pkgs...)...).CombinedOutput()
	if err != nil {
		os.RemoveAll(dir)
		return "", "", fmt.Errorf("building tern: %v\n%s", err, out)
	}
	return dir, path, nil
}

// Require fails or skips t unless /dev/kvm is usable: outside the
// emulated host it skips with a message that begins "no usable /dev/kvm"
// (TERN_KVMHOST=never); inside it fails, since the emulated host exists to
// provide it.
func Require(t testing.TB) {
	t.Helper()
	if !state.mainRan {
		t.Fatal("kvmtest.Require needs kvmtest.Main in the package's TestMain")
	}
	if state.probeErr == nil {
		return
	}
	if state.inside {
		t.Fatalf("/dev/kvm inside the emulated test host is not usable: %v", state.probeErr)
	}
	t.Skipf("no usable /dev/kvm: %v (%s=never keeps the tests out of the emulated test host)", state.probeErr, ModeEnv)
}

// Inside reports whether the tests run inside the emulated test host.
func Inside() bool { return state.inside }

// Tern returns the path of the tern binary that Main built (WithTern),
// here or inside the emulated host. Under `go test -exec 'kvmhost exec'`
// the binary enters the emulated host without Main running on the host
// first, so nothing built tern: Tern then skips t, saying so.
func Tern(t testing.TB) string {
	t.Helper()
	if state.tern == "" && state.inside {
		t.Skip("no tern binary in the emulated test host: it is built by kvmtest.Main on the host, which `go test -exec` bypasses; run go test without -exec")
	}
	if state.tern == "" {
		t.Fatal("kvmtest.Tern needs kvmtest.Main(m, kvmtest.WithTern())")
	}
	return state.tern
}

// Sized returns direct where the tests run on /dev/kvm and emulated inside
// the emulated test host; call it from a test, not a package variable's
// initializer (Main has not run then). There every page a migration sends and every
// exit costs tens of times more (TCG runs QUIC's crypto, the race detector
// and KVM's exits in software), so a test that checks a rule rather than a
// throughput uses it to move fewer pages or make fewer passes there.
func Sized[T any](direct, emulated T) T {
	if state.inside {
		return emulated
	}
	return direct
}
