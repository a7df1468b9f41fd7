package kvmhost

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// These tests run the kvmhost command as a user would. The ones that boot
// the emulated host are few (each boot takes seconds under TCG) and run
// on the host only: QEMU inside the emulated host would be emulation
// within emulation.

// kvmhostCmd is the command built once by TestMain.
var kvmhostCmd string

func TestMain(m *testing.M) {
	if IsInit() {
		RunInit() // TestNetworkForwardsAndReachesHostLoopback boots this binary as /init
	}
	if os.Getenv(echoGuestEnv) != "" {
		os.Exit(runEchoGuest())
	}
	dir, err := os.MkdirTemp("", "kvmhost-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	kvmhostCmd = filepath.Join(dir, "kvmhost")
	if out, err := exec.Command("go", "build", "-o", kvmhostCmd, "tern/tools/kvmhost/cmd/kvmhost").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building kvmhost: %v\n%s", err, out)
		os.Exit(1)
	}
	// The tests boot emulated hosts of their own. Take the machine's
	// one-at-a-time lock once, here, so that waiting for another
	// package's emulated host counts against no test's deadline, and let
	// the boots of this process and of the kvmhost command it runs skip
	// it.
	ctx, cancel := context.WithTimeout(context.Background(), packageLockWait)
	release, err := acquireMachine(ctx, os.Stderr)
	cancel()
	if err != nil {
		fmt.Fprintf(os.Stderr, "kvmhost tests: %v (after %v)\n", err, packageLockWait)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	os.Setenv(LockEnv, "off")
	status := m.Run()
	release()
	os.RemoveAll(dir)
	os.Exit(status)
}

// packageLockWait bounds TestMain's wait for another package's emulated
// host: less than go test's own limit (30 minutes in the README's
// command), more than any one package's emulated run.
const packageLockWait = 25 * time.Minute

// needBoot skips where the emulated host cannot be booted by this test.
func needBoot(t *testing.T) {
	t.Helper()
	if InsideEmulatedHost() {
		t.Skip("inside the emulated host: booting another one would emulate within emulation")
	}
	if _, err := exec.LookPath(qemuBinary); err != nil {
		t.Skip(qemuBinary + " not installed (apt-get install qemu-system-x86)")
	}
}

// command returns the kvmhost command with its TMPDIR in a test directory,
// so that the QEMU it starts is recognisable by its initrd path.
func command(t *testing.T, args ...string) (*exec.Cmd, string) {
	tmp := t.TempDir()
	cmd := exec.Command(kvmhostCmd, args...)
	cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
	return cmd, tmp
}

// exitCode returns the command's exit status.
func exitCode(t *testing.T, err error) int {
	t.Helper()
	var ee *exec.ExitError
	if err != nil && !asExitError(err, &ee) {
		t.Fatalf("running kvmhost: %v", err)
	}
	if ee != nil {
		return ee.ExitCode()
	}
	return 0
}

func asExitError(err error, ee **exec.ExitError) bool {
	e, ok := err.(*exec.ExitError)
	*ee = e
	return ok
}

// qemusUnder returns the pids of processes whose command line mentions dir.
func qemusUnder(dir string) []string {
	var pids []string
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err == nil && bytes.Contains(b, []byte(qemuBinary)) && bytes.Contains(b, []byte(dir)) {
			pids = append(pids, filepath.Base(filepath.Dir(p)))
		}
	}
	return pids
}

func TestExecStatusOutputDirAndFiles(t *testing.T) {
	needBoot(t)
	carried := filepath.Join(t.TempDir(), "carried.txt")
	if err := os.WriteFile(carried, []byte("carried in\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The clocksource is checked in the same boot: with the HPET every
	// clock read traps, and a QUIC stream there moved ten times slower.
	// So is the open-file limit, which must be the kernel's ceiling
	// (fs.nr_open, 1048576 in Debian's kernel), not init's 1024/4096: a
	// test's three regions held more files than that.
	script := `pwd; read line < /etc/kvmhost-test; echo "$line"; read cs < /sys/devices/system/clocksource/clocksource0/current_clocksource; echo "$cs"
echo "nofile $(ulimit -Sn) $(ulimit -Hn)"; i=0
while [ $i -lt 300 ]; do echo "line $i"; i=$((i+1)); done
echo to-stderr >&2; exit 7`
	cmd, _ := command(t, "exec", "--file", carried+":/etc/kvmhost-test", "/bin/sh", "-c", script)
	wd, _ := os.Getwd()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	code := exitCode(t, cmd.Run())
	t.Logf("boot and run took %v", time.Since(start))
	if code != 7 {
		t.Fatalf("exit status %d, want 7; stderr:\n%s", code, stderr.String())
	}
	var want strings.Builder
	fmt.Fprintf(&want, "%s\ncarried in\ntsc\nnofile 1048576 1048576\n", wd)
	for i := range 300 {
		fmt.Fprintf(&want, "line %d\n", i)
	}
	if stdout.String() != want.String() {
		t.Errorf("stdout = %q\nwant %q", stdout.String(), want.String())
	}
	if !strings.Contains(stderr.String(), "to-stderr\n") {
		t.Errorf("stderr = %q, want it to hold to-stderr", stderr.String())
	}
}

func TestExecKillsBinaryAtTimeLimit(t *testing.T) {
	needBoot(t)
	cmd, tmp := command(t, "exec", "--timeout", "30s", "/bin/sh", "-c", "echo started; while :; do :; done")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	code := exitCode(t, cmd.Run())
	if code != 124 {
		t.Fatalf("exit status %d, want 124; stderr:\n%s", code, stderr.String())
	}
	if stdout.String() != "started\n" {
		t.Errorf("stdout = %q, want the binary to have started before the limit", stdout.String())
	}
	if want := "kvmhost: /bin/sh did not finish within the time limit of 30s: QEMU was killed\n"; !strings.HasSuffix(stderr.String(), want) {
		t.Errorf("stderr = %q, want it to end with %q", stderr.String(), want)
	}
	if pids := qemusUnder(tmp); len(pids) > 0 {
		t.Errorf("QEMU still running after the limit: pids %v", pids)
	}
}

func TestExecSIGTERMKillsQEMU(t *testing.T) {
	needBoot(t)
	cmd, tmp := command(t, "exec", "/bin/sh", "-c", "echo started; while :; do :; done")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	started := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(out).ReadString('\n')
		started <- line
		io.Copy(io.Discard, out)
	}()
	select {
	case line := <-started:
		if line != "started\n" {
			cmd.Process.Kill()
			t.Fatalf("first stdout line %q", line)
		}
	case <-time.After(3 * time.Minute):
		cmd.Process.Kill()
		t.Fatal("binary did not start within 3 minutes")
	}
	if pids := qemusUnder(tmp); len(pids) != 1 {
		t.Errorf("QEMU processes while running: %v, want one", pids)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	code := exitCode(t, cmd.Wait())
	if code == 0 || !strings.Contains(stderr.String(), "interrupted by terminated: QEMU was killed") {
		t.Errorf("after SIGTERM: status %d, stderr %q", code, stderr.String())
	}
	if pids := qemusUnder(tmp); len(pids) > 0 {
		t.Errorf("QEMU still running after SIGTERM: pids %v", pids)
	}
}

// oneLineError runs kvmhost and returns its status and stderr, failing
// unless stderr is one line.
func oneLineError(t *testing.T, cmd *exec.Cmd) (int, string) {
	t.Helper()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	code := exitCode(t, cmd.Run())
	if s := stderr.String(); strings.Count(s, "\n") != 1 || !strings.HasSuffix(s, "\n") {
		t.Errorf("stderr is not one line: %q", s)
	}
	return code, strings.TrimSpace(stderr.String())
}

func TestExecMissingBinaryIsOneLine(t *testing.T) {
	cmd, _ := command(t, "exec", "/nonexistent/binary")
	code, msg := oneLineError(t, cmd)
	if code != 125 || msg != "kvmhost: /nonexistent/binary: no such file or directory" {
		t.Errorf("status %d, stderr %q", code, msg)
	}
}

func TestExecUnfetchableKernelIsOneLine(t *testing.T) {
	if _, err := exec.LookPath("apt-get"); err != nil {
		t.Skip("apt-get not installed: no Debian host")
	}
	needBoot(t)
	cmd, _ := command(t, "exec", "/bin/true")
	const pkg = "linux-image-0.0.0-none-amd64"
	cmd.Env = append(cmd.Env, CacheEnv+"="+t.TempDir(), KernelEnv+"="+pkg)
	code, msg := oneLineError(t, cmd)
	if code != 125 || !strings.HasPrefix(msg, "kvmhost: fetching the kernel: downloading "+pkg+": apt-get download: ") {
		t.Errorf("status %d, stderr %q", code, msg)
	}
}

func TestCheckPrintsOneLineEach(t *testing.T) {
	cmd, _ := command(t, "check")
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = io.Discard
	code := exitCode(t, cmd.Run())
	lines := strings.Split(strings.TrimSuffix(stdout.String(), "\n"), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "/dev/kvm: ") || !strings.HasPrefix(lines[1], "emulated host: ") {
		t.Fatalf("check printed %q", stdout.String())
	}
	anyYes := strings.Contains(stdout.String(), ": yes (")
	if (code == 0) != anyYes {
		t.Errorf("status %d with output %q", code, stdout.String())
	}
	t.Log(stdout.String())
}
