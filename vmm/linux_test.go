package vmm_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"tern/vmm"
	"tern/vmm/kvm/kvmtest"
	"tern/vmm/linuxtest"
)

// TestLinuxBootsToInit boots Debian's kernel (the emulated host's), as
// its bzImage with one vCPU and as the vmlinux inside it with two, with
// the test init (vmm/linuxtest), which prints the CPUs the
// kernel brought online and the ACPI tables it found, then its line on
// the serial console and echoes a line typed there: "poweroff", after
// which the kernel powers the bzImage's machine off (Run ends with
// ErrPoweredOff), and "reboot", after which it resets the vmlinux's
// (ErrGuestReset), each through the registers tern's FADT names (not a
// triple fault). So the ACPI tables, SMP through the local APICs, the
// in-kernel irqchip, kvmclock, the UART's interrupt and the power
// registers all work (see linux_platform.go); the exit through port 0xf4
// is the userland tests'. Under nested PVM the test runs itself again in the
// emulated test host (TestVmlinuxPrintsItsBannerUnderNestedPVM is what
// runs there directly).
func TestLinuxBootsToInit(t *testing.T) {
	kvmtest.Require(t)
	g := linuxtest.Files(t)
	if linuxtest.UnderNestedPVM() {
		linuxtest.RunInEmulatedHost(t)
		return
	}
	for _, c := range []struct {
		name, kernel string
		vcpus        int
		wantCPUs     string // /sys/devices/system/cpu/online
		line         string // typed on the console: what the init does then
		wantErr      error  // Run's error after it
	}{
		{"bzImage", g.BzImage, 1, "0", "poweroff", vmm.ErrPoweredOff},
		{"vmlinux", g.Vmlinux, 2, "0-1", "reboot", vmm.ErrGuestReset},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.kernel == "" {
				t.Fatal("no kernel of this format prepared")
			}
			// quiet: a full boot log on the emulated host's TSC
			// clocksource once stalled mid-line (docs/reliability.md).
			// A boot that prints no init line within linuxBoot fails
			// with its Run result (a crash report when the guest
			// faulted) and the console's last lines: it is never
			// booted again, since a guest that stops may be tern's bug.
			vm := newVM(t, vmm.Config{
				Linux:       &vmm.LinuxGuest{Kernel: c.kernel, Initrd: g.Initrd, Cmdline: linuxtest.Cmdline + " quiet"},
				MemoryBytes: 256 << 20,
				VCPUs:       c.vcpus,
			})
			con := newConsole(t, vm)
			con.wait = linuxBoot()
			run := watchRun(startWithin(t, vm, 2*linuxBoot()))
			if !reachedInit(con, linuxBoot(), run.ended) {
				vm.Stop()
				r := run.wait(t)
				t.Fatalf("no %q on the serial console within %v (Run: %d, %v); it printed:\n%s",
					linuxtest.InitLine, linuxBoot(), r.status, r.err, tail(con.seen, 20))
			}
			checkMachine(t, con.seen, c.wantCPUs)
			if n := vm.Serial().Input([]byte(c.line + "\n")); n != len(c.line)+1 {
				t.Fatalf("UART took %d of %d bytes", n, len(c.line)+1)
			}
			con.waitFor("the init's echo", func(l string) bool { return strings.Contains(l, linuxtest.EchoPrefix+c.line) })
			var r runResult
			select {
			case <-run.ended:
				r = run.r
			case <-time.After(linuxBoot()):
				vm.Stop()
				r = run.wait(t)
				h := vm.Serial().Output()
				start, end := h.Bounds()
				from := start
				if end > start+4096 {
					from = end - 4096
				}
				out, _, _, _ := h.ReadFrom(from, 4096)
				t.Fatalf("Run did not return within %v of the %s (then stopped: %d, %v); the console ends:\n%s",
					linuxBoot(), c.line, r.status, r.err, out)
			}
			if !errors.Is(r.err, c.wantErr) || r.status != 0 {
				t.Fatalf("Run = %d, %v; want 0, %v (the kernel's %s through tern's ACPI power registers); the console's last lines:\n%s",
					r.status, r.err, c.wantErr, c.line, tail(con.seen, 20))
			}
		})
	}
}

// TestVmlinuxPrintsItsBannerUnderNestedPVM boots the vmlinux on nested
// PVM's own /dev/kvm, where guest CPL0 code is emulated instruction by
// instruction: entered at startup_64, skipping the bzImage's
// decompressor, the kernel prints its banner (seen after 19-53 s on
// 2026-12-01, with the other cores busy or not; later it stops at an
// instruction PVM does not emulate, a locked CMPXCHG16B, right after the
// slab allocator's "Memory:" line about a minute on).
// Elsewhere TestLinuxBootsToInit covers the vmlinux.
func TestVmlinuxPrintsItsBannerUnderNestedPVM(t *testing.T) {
	kvmtest.Require(t)
	if !linuxtest.UnderNestedPVM() {
		t.Skip("not on nested PVM: TestLinuxBootsToInit boots the vmlinux to its init here")
	}
	g := linuxtest.Files(t)
	vm := newVM(t, vmm.Config{
		Linux:       &vmm.LinuxGuest{Kernel: g.Vmlinux, Initrd: g.Initrd, Cmdline: linuxtest.Cmdline + " earlyprintk=serial,ttyS0,115200"},
		MemoryBytes: 512 << 20,
	})
	const bound = 3 * time.Minute
	ctx, cancel := context.WithTimeout(t.Context(), bound+time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := vm.Run(ctx)
		done <- err
	}()
	con := newConsole(t, vm)
	deadline := time.After(bound)
	for {
		line, ok := con.next(deadline)
		if !ok {
			vm.Stop()
			t.Fatalf("no \"Linux version\" within %v (Run: %v); it printed:\n%s", bound, <-done, tail(con.seen, 20))
		}
		if strings.Contains(line, "Linux version") {
			t.Logf("serial: %s", line)
			break
		}
	}
	vm.Stop()
	<-done // ErrStopped, or an emulation failure had it stopped already
}

// checkMachine checks what a Linux guest printed up to its init line: the
// kernel found tern's ACPI tables (no "RSDP was not found"), every vCPU
// with the APIC ID CPUID gives it (no "APIC id mismatch", which the
// kernel prints even when quiet), and the init saw wantCPUs online.
func checkMachine(t *testing.T, seen []string, wantCPUs string) {
	t.Helper()
	var cpus, tables string
	for _, l := range seen {
		for _, bad := range []string{"RSDP was not found", "APIC id mismatch", "ACPI BIOS Error", "ACPI Error"} {
			if strings.Contains(l, bad) {
				t.Errorf("the kernel printed %q", l)
			}
		}
		if _, v, ok := strings.Cut(l, linuxtest.CPUsPrefix); ok {
			cpus = v
		}
		if _, v, ok := strings.Cut(l, linuxtest.ACPIPrefix); ok {
			tables = v
		}
	}
	if cpus != wantCPUs {
		t.Errorf("the init saw CPUs %q online, want %q; the console:\n%s", cpus, wantCPUs, tail(seen, 30))
	}
	for _, sig := range []string{"APIC", "DSDT", "FACP"} {
		if !slices.Contains(strings.Fields(tables), sig) {
			t.Errorf("the kernel's ACPI tables are %q, without %s", tables, sig)
		}
	}
}

// tail returns the last n lines joined.
func tail(lines []string, n int) string {
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// runWatch holds Run's result once ended is closed.
type runWatch struct {
	ended chan struct{}
	r     runResult
}

// watchRun takes Run's result from done.
func watchRun(done <-chan runResult) *runWatch {
	w := &runWatch{ended: make(chan struct{})}
	go func() {
		w.r = <-done
		close(w.ended)
	}()
	return w
}

// wait returns Run's result or fails the test after the generous bound.
func (w *runWatch) wait(t *testing.T) runResult {
	t.Helper()
	select {
	case <-w.ended:
		return w.r
	case <-time.After(generous + time.Minute):
		t.Fatal("Run did not return")
		return runResult{}
	}
}

// reachedInit reads con until the init's line, or false after limit or
// once Run has returned (ended closed) and every line it printed was read.
func reachedInit(con *console, limit time.Duration, ended <-chan struct{}) bool {
	deadline := make(chan time.Time)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		timer := time.NewTimer(limit)
		defer timer.Stop()
		select {
		case <-timer.C:
		case <-ended:
		case <-stop:
			return
		}
		close(deadline)
	}()
	for {
		line, ok := con.next(deadline)
		if !ok {
			return false
		}
		if strings.Contains(line, linuxtest.InitLine) {
			return true
		}
	}
}
