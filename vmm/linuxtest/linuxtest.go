// Package linuxtest prepares the Linux guest the tests boot: Debian's
// kernel (the package the emulated test host boots, from kvmhost's cache)
// as its bzImage and, with PrepareWithVmlinux, as the uncompressed ELF
// vmlinux, and an initramfs whose /init is linuxinit, which prints
// InitLine on the console, echoes one line typed there after EchoPrefix
// and exits with status 0 through port 0xf4. Test packages pass Prepare
// or PrepareWithVmlinux to kvmtest.Main and call Files in their tests.
//
// Under nested PVM guest code at CPL0 is emulated instruction by
// instruction, far too slow for a stock kernel (its bzImage printed
// nothing in 60-90 s); there RunInEmulatedHost runs the test again inside
// the emulated test host, so the test runs on both kinds of machine.
package linuxtest

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"tern/internal/kvmhost"
	"tern/vmm/kvm"
	"tern/vmm/kvm/kvmtest"
	"tern/vmm/linuxguest"
)

// What linuxinit prints: CPUsPrefix and the online CPUs' list ("0-1"),
// ACPIPrefix and the ACPI tables the kernel found ("APIC DSDT FACP"),
// then InitLine; later EchoPrefix and the line it read.
const (
	InitLine   = "tern-linux-init: hello"
	EchoPrefix = "tern-linux-init: echo "
	CPUsPrefix = "tern-linux-init: cpus online "
	ACPIPrefix = "tern-linux-init: acpi tables "
)

// Cmdline is the tests' kernel command line. tern gives the kernel
// kvmclock and a TSC-deadline timer (vmm/linux_platform.go), so it needs
// no tsc_early_khz. no_timer_check skips the kernel's check of the PIT's
// interrupt through the IOAPIC; with tern's hardware-reduced ACPI tables
// (vmm/acpi) the kernel sets up no PIT and makes no such check, so it
// only matters to a kernel that ignores the tables.
const Cmdline = "console=ttyS0 panic=-1 no_timer_check"

// Environment through which Prepare hands the tests their files (or why
// there are none), here and in the emulated host, which inherits it.
const (
	kernelEnv  = "TERN_LINUXTEST_KERNEL"
	vmlinuxEnv = "TERN_LINUXTEST_VMLINUX"
	initrdEnv  = "TERN_LINUXTEST_INITRD"
	skipEnv    = "TERN_LINUXTEST_SKIP"
)

// Prepare is a kvmtest.WithPrepare function: it finds the kernel's
// bzImage and builds the initramfs. What cannot be had (no apt, no go)
// becomes the tests' skip reason (Files), not a failure of the package.
func Prepare() ([]kvmhost.File, func(), error) { return prepare(false) }

// PrepareWithVmlinux is Prepare with the vmlinux too, which is carried
// into the emulated host as well (66 MB for Debian's 6.1).
func PrepareWithVmlinux() ([]kvmhost.File, func(), error) { return prepare(true) }

func prepare(vmlinux bool) ([]kvmhost.File, func(), error) {
	skip := func(err error) ([]kvmhost.File, func(), error) {
		os.Setenv(skipEnv, err.Error())
		return nil, nil, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	kernel, err := kvmhost.EnsureBzImage(ctx, os.Stderr)
	if err != nil {
		return skip(fmt.Errorf("no Debian kernel: %w", err))
	}
	dir, err := os.MkdirTemp("", "tern-linuxtest-")
	if err != nil {
		return nil, nil, err
	}
	cleanup := func() { os.RemoveAll(dir) }
	initBin := filepath.Join(dir, "init")
	build := exec.CommandContext(ctx, "go", "build", "-o", initBin, "tern/vmm/linuxtest/linuxinit")
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
	os.Setenv(kernelEnv, kernel)
	os.Setenv(initrdEnv, initrd)
	os.Unsetenv(skipEnv)
	files := []kvmhost.File{{Host: kernel}, {Host: initrd}}
	if vmlinux {
		k, err := kvmhost.EnsureKernel(ctx, os.Stderr) // cached by EnsureBzImage
		if err != nil {
			cleanup()
			return nil, nil, err
		}
		os.Setenv(vmlinuxEnv, k.Vmlinux())
		files = append(files, kvmhost.File{Host: k.Vmlinux()})
	}
	return files, cleanup, nil
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

// Guest is what Prepare made: the paths of the kernel and the initramfs.
type Guest struct {
	// BzImage is Debian's vmlinuz; Vmlinux the ELF kernel inside it,
	// empty unless PrepareWithVmlinux made it.
	BzImage, Vmlinux string
	Initrd           string
}

// Files returns what Prepare made, or skips t with the reason there is
// nothing.
func Files(t testing.TB) Guest {
	t.Helper()
	if why := os.Getenv(skipEnv); why != "" {
		t.Skip(why)
	}
	g := Guest{BzImage: os.Getenv(kernelEnv), Vmlinux: os.Getenv(vmlinuxEnv), Initrd: os.Getenv(initrdEnv)}
	if g.BzImage == "" || g.Initrd == "" {
		t.Skip("no Linux kernel prepared: run the tests through kvmtest.Main with linuxtest.Prepare, without go test -exec")
	}
	return g
}

// Environment through which PrepareUserland hands the tests the userland
// (or why there is none).
const (
	userlandKernelEnv = "TERN_LINUXTEST_USERLAND_KERNEL"
	userlandInitrdEnv = "TERN_LINUXTEST_USERLAND_INITRD"
	userlandRelEnv    = "TERN_LINUXTEST_USERLAND_RELEASE"
	userlandSkipEnv   = "TERN_LINUXTEST_USERLAND_SKIP"
)

// PrepareUserland is a kvmtest.WithPrepare function: it builds (or finds
// in the kernel cache's linuxguest directory) tern's Linux userland,
// Debian's bzImage with the linuxguest initramfs, so that it is carried
// into the emulated host. What cannot be had (no apt) becomes the tests'
// skip reason (Userland), not a failure of the package.
func PrepareUserland() ([]kvmhost.File, func(), error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cache, err := kvmhost.CacheDir()
	if err == nil {
		var f linuxguest.Files
		if f, err = linuxguest.Build(ctx, filepath.Join(cache, "linuxguest"), os.Stderr); err == nil {
			os.Setenv(userlandKernelEnv, f.Kernel)
			os.Setenv(userlandInitrdEnv, f.Initramfs)
			os.Setenv(userlandRelEnv, f.Release)
			os.Unsetenv(userlandSkipEnv)
			return []kvmhost.File{{Host: f.Kernel}, {Host: f.Initramfs}}, nil, nil
		}
	}
	os.Setenv(userlandSkipEnv, fmt.Sprintf("no Linux userland: %v", err))
	return nil, nil, nil
}

// UserlandFiles is what PrepareUserland made.
type UserlandFiles struct {
	// Kernel is Debian's bzImage; Initrd the linuxguest initramfs.
	Kernel, Initrd string
	// Release is the kernel's release (uname -r).
	Release string
}

// Userland returns what PrepareUserland made, or skips t with the reason
// there is nothing.
func Userland(t testing.TB) UserlandFiles {
	t.Helper()
	if why := os.Getenv(userlandSkipEnv); why != "" {
		t.Skip(why)
	}
	u := UserlandFiles{Kernel: os.Getenv(userlandKernelEnv), Initrd: os.Getenv(userlandInitrdEnv), Release: os.Getenv(userlandRelEnv)}
	if u.Kernel == "" || u.Initrd == "" {
		t.Skip("no Linux userland prepared: run the tests through kvmtest.Main with linuxtest.PrepareUserland, without go test -exec")
	}
	return u
}

// UnderNestedPVM reports whether /dev/kvm is kvm-pvm's (kvm.PVM, the
// decision tern up makes too) and the tests run on it, not in the
// emulated host.
func UnderNestedPVM() bool {
	return kvm.PVM() && !kvmtest.Inside()
}

// RunInEmulatedHost runs t's test again, alone, from this test binary with
// TERN_KVMHOST=always, and fails t unless it ran inside the emulated host
// and passed. A failed test is never run again; only an emulated host that
// failed on its own is booted once more (kvmhost.Options.RetryStall). t
// must be a top-level test.
func RunInEmulatedHost(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Fatalf("nested PVM: %s runs in the emulated test host, which needs qemu-system-x86_64 (apt-get install qemu-system-x86): %v", t.Name(), err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if err := runInEmulatedHost(t, self); err != nil {
		t.Fatal(err)
	}
}

// runInEmulatedHost runs t's test in the emulated host and returns an
// error unless it ran there and passed. Each boot inside may take minutes
// with the rest of the suite on the same cores (the tests scale their
// waits there): 17 minutes for the test inside, whose binary then panics
// with every goroutine's stack (a test stuck in there says where); the
// emulated host is killed 3 minutes after that (kvmtest's boot allowance,
// the console's last lines printed: a machine that hung says why), and
// this process 2 minutes later still, or twice that in all when the
// emulated host failed on its own and was booted once more (the
// package's own timeout bounds the whole).
func runInEmulatedHost(t *testing.T, self string) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*22*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, self, "-test.run=^"+t.Name()+"$", "-test.v", "-test.count=1", "-test.timeout=17m")
	// Two emulated CPUs: with one, the machine does nothing else while
	// the Linux guest runs, and stalled (see kvmhost.CPUsEnv).
	cmd.Env = append(os.Environ(), kvmtest.ModeEnv+"=always", kvmhost.CPUsEnv+"=2")
	t.Logf("nested PVM: guest CPL0 code is emulated in software here, too slow for a stock kernel; running %s in the emulated test host", t.Name())
	start := time.Now()
	// Each line is logged as it comes, so a test that hangs in there
	// shows how far it got, and when, however it ends.
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = w, w
	err = cmd.Start()
	w.Close()
	if err != nil {
		r.Close()
		return fmt.Errorf("starting %s in the emulated host: %v", t.Name(), err)
	}
	// Killed at the deadline, the binary may leave a child holding the
	// pipe open: stop reading a while after.
	stopRead := context.AfterFunc(ctx, func() { time.AfterFunc(30*time.Second, func() { r.Close() }) })
	defer stopRead()
	var out strings.Builder
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		t.Logf("[emulated host, %4.0fs] %s", time.Since(start).Seconds(), sc.Text())
		out.WriteString(sc.Text() + "\n")
	}
	r.Close()
	err = cmd.Wait()
	switch {
	case err != nil:
		return fmt.Errorf("%s in the emulated host: %v (its output is above)", t.Name(), err)
	case !strings.Contains(out.String(), kvmtest.InsideBanner):
		return fmt.Errorf("%s did not run inside the emulated host (its output is above)", t.Name())
	case !strings.Contains(out.String(), "--- PASS: "+t.Name()+" "):
		return fmt.Errorf("%s did not pass in the emulated host (its output is above)", t.Name())
	}
	t.Logf("passed in the emulated host, %.1fs in all", time.Since(start).Seconds())
	return nil
}
