package vmm_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"tern/vmm"
	"tern/vmm/guests"
	"tern/vmm/kvm"
	"tern/vmm/kvm/kvmtest"
	"tern/vmm/memory"
)

// smpPass reads the smp guest's lines until a pass for which done is
// true and returns it; a FAIL line, or an exception, fails the test.
func (c *console) smpPass(what string, done func(guests.SMPPass) bool) guests.SMPPass {
	c.t.Helper()
	var p guests.SMPPass
	c.waitFor(what, func(l string) bool {
		if strings.HasPrefix(l, guests.SMPFailPrefix) || strings.HasPrefix(l, guests.ExceptionPrefix) {
			c.t.Fatalf("smp guest: %s", l)
		}
		var ok bool
		p, ok = guests.ParseSMPPass(l)
		return ok && done(p)
	})
	return p
}

// TestSMPGuestStartsItsAPsAndEveryCPUKeepsCounting runs the smp guest on
// four vCPUs with the in-kernel local APICs: the BSP starts the three
// others with INIT and SIPI from KVM's reset state, and every CPU then
// keeps working, verifying its memory, taking its timer and the others'
// IPIs, none lost.
func TestSMPGuestStartsItsAPsAndEveryCPUKeepsCounting(t *testing.T) {
	kvmtest.Require(t)
	const cpus = 4
	vm := newVM(t, vmm.Config{Guest: "smp", MemoryBytes: 32 << 20, VCPUs: cpus})
	// Before Run: the APs wait in KVM's reset state for INIT and SIPI.
	for _, c := range vm.KVMVCPUs()[1:] {
		if mp, err := c.MPState(); err != nil || mp != kvm.MPStateUninitialized {
			t.Fatalf("vCPU %d before Run: MP state %v (%v), want uninitialized", c.ID(), mp, err)
		}
	}
	con := newConsole(t, vm)
	done := start(t, vm)
	con.waitLine(guests.SMPAllStarted(cpus))
	checkSMPTimers(t, vm, con.waitFor("the timers line", func(l string) bool { _, ok := guests.ParseSMPTimers(l); return ok }), cpus)
	first := con.smpPass("a pass with every CPU started", func(p guests.SMPPass) bool { return p.APs == "started" })
	if len(first.CPUs) != cpus {
		t.Fatalf("pass of %d CPUs, want %d", len(first.CPUs), cpus)
	}
	last := first
	for range 4 {
		p := con.smpPass("a pass", func(guests.SMPPass) bool { return true })
		if err := guests.CheckSMPProgress(last, p); err != nil {
			t.Fatal(err)
		}
		last = p
	}
	if err := guests.CheckSMPTimerRate(last); err != nil {
		t.Fatal(err)
	}
	t.Logf("pass %d: %+v", last.N, last.CPUs)
	vm.Stop()
	if r := wait(t, done); !errors.Is(r.err, vmm.ErrStopped) {
		t.Fatalf("Run = %d, %v; want ErrStopped", r.status, r.err)
	}
}

// checkSMPTimers checks the smp guest's timers line: the odd CPUs' timers
// in TSC-deadline mode where KVM has it, the others periodic.
func checkSMPTimers(t *testing.T, vm *vmm.VM, line string, cpus int) {
	t.Helper()
	has, err := vm.KVM().CheckExtension(kvm.CapTSCDeadlineTimer)
	if err != nil {
		t.Fatal(err)
	}
	modes, _ := guests.ParseSMPTimers(line)
	if want := guests.SMPWantTimers(cpus, has > 0); !slices.Equal(modes, want) {
		t.Fatalf("timers %q, want %q (KVM_CAP_TSC_DEADLINE_TIMER %d)", modes, want, has)
	}
}

// TestSMPGuestReportsASpoiledWordOfAnAPsMemory proves the smp guest's
// memory check: a word of CPU 2's region changed behind its back makes the
// guest report that CPU's memory and exit 1.
func TestSMPGuestReportsASpoiledWordOfAnAPsMemory(t *testing.T) {
	kvmtest.Require(t)
	vm := newVM(t, vmm.Config{Guest: "smp", MemoryBytes: 32 << 20, VCPUs: 3})
	con := newConsole(t, vm)
	done := start(t, vm)
	var regions, size uint64
	con.waitFor("the smp guest's first line", func(l string) bool {
		_, r, s, ok := guests.ParseSMPStart(l)
		regions, size = r, s
		return ok
	})
	con.waitLine(guests.SMPAllStarted(3))
	// The first word of a page: slot k's, which CPU 2 writes as it
	// passes; ^0 is nothing it ever writes.
	if err := vm.Memory().PutUint64(0x1000+memory.GPA(regions+2*size), ^uint64(0)); err != nil {
		t.Fatal(err)
	}
	line := con.waitFor("a FAIL line", func(l string) bool { return strings.HasPrefix(l, guests.SMPFailPrefix) })
	if !strings.HasPrefix(line, "smp: FAIL cpu 2 memory") {
		t.Fatalf("guest: %q, want CPU 2's memory reported", line)
	}
	if r := wait(t, done); r.err != nil || r.status != 1 {
		t.Fatalf("Run = %d, %v; want exit status 1", r.status, r.err)
	}
}
