package kvm

import (
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

func TestRunExitLayouts(t *testing.T) {
	if got := unsafe.Offsetof(runHeader{}.ImmediateExit); got != 1 {
		t.Errorf("offsetof(kvm_run.immediate_exit) = %d, want 1", got)
	}
	if got := unsafe.Sizeof(internalErrorExit{}); got != 136 {
		t.Errorf("sizeof(kvm_run.internal) = %d, want 136", got)
	}
	if kvmGetTSCkHz != 0xAE<<8|0xa3 {
		t.Errorf("KVM_GET_TSC_KHZ = %#x", kvmGetTSCkHz)
	}
}

// TestImmediateExitMakesRunReturnIntr runs a real-mode guest that spins
// (jmp $) with immediate_exit set: Run must return ExitIntr without
// entering it, and the byte reads back until cleared. (This package cannot
// use kvmtest, which imports it; without a usable /dev/kvm it skips.)
func TestImmediateExitMakesRunReturnIntr(t *testing.T) {
	if err := Probe(); err != nil {
		t.Skipf("no usable /dev/kvm: %v", err)
	}
	sys, err := Open()
	if err != nil {
		t.Fatal(err)
	}
	defer sys.Close()
	vm, err := sys.CreateVM()
	if err != nil {
		t.Fatal(err)
	}
	defer vm.Close()
	mem, err := unix.Mmap(-1, 0, unix.Getpagesize(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	copy(mem, []byte{0xeb, 0xfe}) // jmp $
	if err := vm.SetUserMemoryRegion(MemoryRegion{GuestPhysAddr: probeAddr, Memory: mem}); err != nil {
		t.Fatal(err)
	}
	cpu, err := vm.CreateVCPU(0)
	if err != nil {
		t.Fatal(err)
	}
	if err := StartRealMode(cpu, probeAddr); err != nil {
		t.Fatal(err)
	}
	cpu.SetImmediateExit(true)
	if !cpu.ImmediateExit() {
		t.Fatal("ImmediateExit() = false after SetImmediateExit(true)")
	}
	exit, err := cpu.Run()
	if err != nil || exit != ExitIntr {
		t.Fatalf("Run with immediate_exit = %v, %v; want INTR", exit, err)
	}
	cpu.SetImmediateExit(false)
	if cpu.ImmediateExit() {
		t.Fatal("ImmediateExit() = true after SetImmediateExit(false)")
	}
}
