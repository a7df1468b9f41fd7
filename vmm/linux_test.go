package vmm_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"tern/tools/kvmhost"
	"tern/vmm"
	"tern/vmm/kvm/kvmtest"
)

// Environment through which prepareLinux hands the Linux boot test its
// files (or why there are none), here and in the emulated host.
const (
	linuxKernelEnv = "TERN_VMM_TEST_LINUX_KERNEL"
	linuxInitrdEnv = "TERN_VMM_TEST_LINUX_INITRD"
	linuxSkipEnv   = "TERN_VMM_TEST_LINUX_SKIP"
)

// linuxInitLine is what testdata/linuxinit prints first.
const linuxInitLine = "tern-linux-init: hello"

// prepareLinux runs on the host before the tests (kvmtest.WithPrepare):
// the emulated host's own Debian kernel as a bzImage from kvmhost's cache,
// and an initramfs holding testdata/linuxinit, built static. What cannot
// be had (no apt, no go) becomes the test's skip reason, not a failure of
// the package.
func prepareLinux() ([]kvmhost.File, func(), error) {
	skip := func(err error) ([]kvmhost.File, func(), error) {
		os.Setenv(linuxSkipEnv, err.Error())
		return nil, nil, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	kernel, err := kvmhost.EnsureBzImage(ctx, os.Stderr)
	if err != nil {
		return skip(fmt.Errorf("no Debian kernel: %w", err))
	}
	dir, err := os.MkdirTemp("", "tern-vmm-linux-")
	if err != nil {
		return nil, nil, err
	}
	cleanup := func() { os.RemoveAll(dir) }
	initBin := filepath.Join(dir, "init")
	build := exec.CommandContext(ctx, "go", "build", "-o", initBin, "./testdata/linuxinit")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		cleanup()
		return skip(fmt.Errorf("building the test init: %v: %s", err, out))
	}
	initrd := filepath.Join(dir, "initrd.cpio")
	if err := writeInitramfs(initrd, initBin); err != nil {
		cleanup()
		return nil, nil, err
	}
	os.Setenv(linuxKernelEnv, kernel)
	os.Setenv(linuxInitrdEnv, initrd)
	return []kvmhost.File{{Host: kernel}, {Host: initrd}}, cleanup, nil
}

// writeInitramfs writes an initramfs with an empty /dev and init as /init.
func writeInitramfs(dst, init string) error {
	b, err := os.ReadFile(init)
	if err != nil {
		return err
	}
	f, err := os.Create(dst)
	if err != nil {
		return err
	}
	c := kvmhost.NewCPIO(f)
	c.Dir("dev")
	c.File("init", 0o755, int64(len(b)), bytes.NewReader(b))
	if err := c.Close(); err != nil {
		f.Close()
		return fmt.Errorf("writing initramfs: %w", err)
	}
	return f.Close()
}

// TestLinuxBootsToInit boots Debian's kernel (the emulated host's) with
// the test init, which prints its line on the serial console, echoes a
// line typed there and exits with status 0 through port 0xf4: the
// UART's interrupt, the in-kernel irqchip and kvmclock all work (see
// linux_platform.go). Under nested PVM, where a stock kernel's CPL0 code
// is emulated instruction by instruction (the bzImage printed nothing in
// 60-90 s there), the test runs itself again in the emulated test host.
func TestLinuxBootsToInit(t *testing.T) {
	kvmtest.Require(t)
	if why := os.Getenv(linuxSkipEnv); why != "" {
		t.Skip(why)
	}
	if underNestedPVM() {
		runInEmulatedHost(t, "^TestLinuxBootsToInit$")
		return
	}
	kernel, initrd := os.Getenv(linuxKernelEnv), os.Getenv(linuxInitrdEnv)
	if kernel == "" || initrd == "" {
		t.Skip("no kernel prepared: run the tests through kvmtest.Main, without go test -exec")
	}
	vm := newVM(t, vmm.Config{
		Linux:       &vmm.LinuxGuest{Kernel: kernel, Initrd: initrd, Cmdline: linuxTestCmdline},
		MemoryBytes: 512 << 20,
	})
	con := newConsole(t, vm)
	done := start(t, vm)
	con.waitFor(linuxInitLine, func(l string) bool { return strings.Contains(l, linuxInitLine) })
	if n := vm.Serial().Input([]byte("ping\n")); n != 5 {
		t.Fatalf("UART took %d of 5 bytes", n)
	}
	con.waitFor("the init's echo", func(l string) bool { return strings.Contains(l, linuxEchoPrefix+"ping") })
	if r := wait(t, done); r.err != nil || r.status != 0 {
		t.Fatalf("Run = %d, %v; want 0, nil (the init's exit through port 0xf4); the console's last lines:\n%s", r.status, r.err, tail(con.seen, 20))
	}
}

// linuxTestCmdline is the Linux tests' kernel command line. tern gives
// the kernel kvmclock and a TSC-deadline timer (linux_platform.go), so
// it needs no tsc_early_khz; no_timer_check skips a check of the PIT's
// interrupt through an IOAPIC the kernel finds no table for.
const linuxTestCmdline = "console=ttyS0 panic=-1 no_timer_check"

// linuxEchoPrefix is what testdata/linuxinit prints before a line it
// read from the console.
const linuxEchoPrefix = "tern-linux-init: echo "

// runInEmulatedHost runs the test binary again with TERN_KVMHOST=always
// and only the tests run matches, and fails t unless they ran inside the
// emulated host and passed.
func runInEmulatedHost(t *testing.T, run string) {
	t.Helper()
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Fatalf("nested PVM: this test runs in the emulated test host, which needs qemu-system-x86_64 (apt-get install qemu-system-x86): %v", err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, self, "-test.run="+run, "-test.v", "-test.count=1", "-test.timeout=5m")
	cmd.Env = append(os.Environ(), kvmtest.ModeEnv+"=always")
	t.Logf("nested PVM: guest CPL0 code is emulated in software here, too slow for a stock kernel; running %s in the emulated test host", run)
	start := time.Now()
	out, err := cmd.CombinedOutput()
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if err != nil {
		t.Fatalf("the test in the emulated host: %v; it printed:\n%s", err, tail(lines, 60))
	}
	if !strings.Contains(string(out), kvmtest.InsideBanner) {
		t.Fatalf("the re-executed test did not run inside the emulated host; it printed:\n%s", tail(lines, 60))
	}
	name := strings.Trim(run, "^$")
	if !strings.Contains(string(out), "--- PASS: "+name+" ") {
		t.Fatalf("%s did not pass in the emulated host; it printed:\n%s", name, tail(lines, 60))
	}
	t.Logf("passed in the emulated host, %.1fs in all; the last lines:\n%s", time.Since(start).Seconds(), tail(lines, 8))
}

// underNestedPVM reports whether /dev/kvm is kvm-pvm's (see
// /sys/module/kvm_pvm): there guest CPL0 code is emulated in software.
func underNestedPVM() bool {
	_, err := os.Stat("/sys/module/kvm_pvm")
	return err == nil && !kvmtest.Inside()
}

// tail returns the last n lines joined.
func tail(lines []string, n int) string {
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
