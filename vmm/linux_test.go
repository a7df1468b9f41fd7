package vmm_test

import (
	"strings"
	"testing"

	"tern/vmm"
	"tern/vmm/internal/linuxtest"
	"tern/vmm/kvm/kvmtest"
)

// TestLinuxBootsToInit boots Debian's kernel (the emulated host's) with
// the test init (vmm/internal/linuxtest), which prints its line on the
// serial console, echoes a line typed there and exits with status 0
// through port 0xf4: the in-kernel irqchip, kvmclock and the UART's
// interrupt all work (see linux_platform.go). Under nested PVM the test
// runs itself again in the emulated test host.
func TestLinuxBootsToInit(t *testing.T) {
	kvmtest.Require(t)
	kernel, initrd := linuxtest.Files(t)
	if linuxtest.UnderNestedPVM() {
		linuxtest.RunInEmulatedHost(t)
		return
	}
	vm := newVM(t, vmm.Config{
		Linux:       &vmm.LinuxGuest{Kernel: kernel, Initrd: initrd, Cmdline: linuxtest.Cmdline},
		MemoryBytes: 512 << 20,
	})
	con := newConsole(t, vm)
	done := start(t, vm)
	con.waitFor(linuxtest.InitLine, func(l string) bool { return strings.Contains(l, linuxtest.InitLine) })
	if n := vm.Serial().Input([]byte("ping\n")); n != 5 {
		t.Fatalf("UART took %d of 5 bytes", n)
	}
	con.waitFor("the init's echo", func(l string) bool { return strings.Contains(l, linuxtest.EchoPrefix+"ping") })
	if r := wait(t, done); r.err != nil || r.status != 0 {
		t.Fatalf("Run = %d, %v; want 0, nil (the init's exit through port 0xf4); the console's last lines:\n%s", r.status, r.err, tail(con.seen, 20))
	}
}

// tail returns the last n lines joined.
func tail(lines []string, n int) string {
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
