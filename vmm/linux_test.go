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

// linuxInitLine is what testdata/linuxinit prints.
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
// the test init. In the emulated host, on real KVM, the init's line must
// arrive on the serial console. Under nested PVM a stock kernel dies in
// its FPU/XSAVE set-up soon after it starts printing, so there only its
// "Linux version" banner is asserted.
func TestLinuxBootsToInit(t *testing.T) {
	kvmtest.Require(t)
	if why := os.Getenv(linuxSkipEnv); why != "" {
		t.Skip(why)
	}
	kernel, initrd := os.Getenv(linuxKernelEnv), os.Getenv(linuxInitrdEnv)
	if kernel == "" || initrd == "" {
		t.Skip("no kernel prepared: run the tests through kvmtest.Main, without go test -exec")
	}
	vm := newVM(t, vmm.Config{
		Linux: &vmm.LinuxGuest{
			Kernel: kernel, Initrd: initrd,
			Cmdline: "console=ttyS0 earlyprintk=serial,ttyS0,115200 panic=-1 no_timer_check tsc=reliable",
		},
		MemoryBytes: 512 << 20,
	})
	done := start(t, vm)
	// The emulated host runs KVM on a software CPU: minutes. There the
	// kernel was seen (2026-12-01) to decompress, print its banner and
	// set up memory, then stall in timer set-up ("tsc: Unable to calibrate
	// against PIT"), short of /init: until tern gives it a timer it can
	// calibrate against, the banner is asserted there too and the init
	// line only on other hosts with real KVM.
	want, bound := linuxInitLine, 10*time.Minute
	if kvmtest.Inside() {
		want = "Linux version"
	}
	pvm := underNestedPVM()
	if pvm {
		want, bound = "Linux version", time.Minute
	}
	c := newConsole(t, vm)
	deadline := time.After(bound)
	for {
		line, ok := c.next(deadline)
		if !ok {
			vm.Stop()
			r := <-done
			if pvm {
				// Guest CPL0 code is emulated here (≈0.7 M instructions/s):
				// the bzImage's XZ decompressor alone needs billions.
				t.Skipf("nested PVM: no %q within %v (guest CPL0 code is emulated in software, too slow for the bzImage's decompressor); Run: %d, %v; %d lines:\n%s", want, bound, r.status, r.err, len(c.seen), tail(c.seen, 20))
			}
			t.Fatalf("no %q on the serial console (Run: %d, %v); it printed:\n%s", want, r.status, r.err, tail(c.seen, 60))
		}
		if strings.Contains(line, want) {
			t.Logf("serial: %s", line)
			t.Logf("%d lines before it; the last:\n%s", len(c.seen), tail(c.seen, 10))
			return // the cleanup stops the VM
		}
	}
}

// underNestedPVM reports whether /dev/kvm is kvm-pvm's (see
// there guest CPL0 code is emulated in software).
func underNestedPVM() bool {
	_, err := os.Stat("/sys/module/kvm_pvm")
	return err == nil && !kvmtest.Inside()
}

// tail returns the last n lines joined.
func tail(lines []string, n int) string {
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
