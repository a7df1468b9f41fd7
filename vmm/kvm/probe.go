package kvm

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// probeCode is the probe's real-mode guest: hlt.
var probeCode = []byte{0xf4}

// probeAddr is where the probe's guest page sits and its code starts.
const probeAddr = 0x1000

// Probe reports whether /dev/kvm is usable here: it opens it, creates a
// VM with one page of memory and runs one vCPU in real mode to HLT. The
// error says exactly which step failed and why; nil means usable.
func Probe() error {
	sys, err := Open()
	if err != nil {
		return err
	}
	defer sys.Close()
	vm, err := sys.CreateVM()
	if err != nil {
		return err
	}
	defer vm.Close()
	mem, err := unix.Mmap(-1, 0, unix.Getpagesize(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return fmt.Errorf("mapping probe guest memory: %w", err)
	}
	// vm.Close runs first (deferred later), so the slot is gone before the
	// memory is unmapped.
	defer unix.Munmap(mem)
	copy(mem, probeCode)
	if err := vm.SetUserMemoryRegion(MemoryRegion{Slot: 0, GuestPhysAddr: probeAddr, Memory: mem}); err != nil {
		return err
	}
	cpu, err := vm.CreateVCPU(0)
	if err != nil {
		return err
	}
	if err := StartRealMode(cpu, probeAddr); err != nil {
		return err
	}
	for range 16 {
		exit, err := cpu.Run()
		if err != nil {
			return err
		}
		switch exit {
		case ExitHLT:
			return nil
		case ExitIntr:
			continue
		default:
			return fmt.Errorf("running probe guest: vCPU exited with %v, want HLT", exit)
		}
	}
	return fmt.Errorf("running probe guest: no HLT after 16 runs")
}

// StartRealMode sets vCPU c to start in real mode at physical address
// entry (below 64 KiB): CS and the data segments based at 0, RIP=entry,
// flags with only the reserved bit set.
func StartRealMode(c *VCPU, entry uint64) error {
	s, err := c.Sregs()
	if err != nil {
		return err
	}
	for _, seg := range []*Segment{&s.CS, &s.DS, &s.ES, &s.FS, &s.GS, &s.SS} {
		seg.Base, seg.Selector = 0, 0
	}
	if err := c.SetSregs(s); err != nil {
		return err
	}
	return c.SetRegs(Regs{RIP: entry, RFLAGS: 2})
}
