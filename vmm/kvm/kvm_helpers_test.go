package kvm_test

import (
	"encoding/binary"
	"errors"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"

	"tern/vmm/kvm"
	"tern/vmm/kvm/kvmtest"
	"tern/vmm/memory"
)

func TestMain(m *testing.M) { kvmtest.Main(m) }

// testVM is a VM with its memory, closed at the end of the test (the VM
// first, then the memory behind its slots).
type testVM struct {
	sys *kvm.System
	vm  *kvm.VM
	mem *memory.Memory
	// slots are the regions set with addSlot, by slot number.
	slots map[uint32]kvm.MemoryRegion
}

// newTestVM opens KVM, creates a VM and a memory of the given regions;
// setup, when not nil, runs on the VM before any slot exists (rings and
// irqchips must precede vCPUs, some caps precede slots).
func newTestVM(t *testing.T, setup func(*kvm.VM) error, regions ...memory.RegionSpec) *testVM {
	t.Helper()
	kvmtest.Require(t)
	sys, err := kvm.Open()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sys.Close() })
	mem, err := memory.New(regions...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mem.Close() })
	vm, err := sys.CreateVM()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { vm.Close() }) // runs before mem.Close
	if setup != nil {
		if err := setup(vm); err != nil {
			if errors.Is(err, kvm.ErrNotSupported) {
				t.Skipf("setting up the VM: %v", err)
			}
			t.Fatal(err)
		}
	}
	return &testVM{sys: sys, vm: vm, mem: mem, slots: map[uint32]kvm.MemoryRegion{}}
}

// addSlot maps memory region i of the VM's memory as slot.
func (v *testVM) addSlot(t *testing.T, slot uint32, i int, flags uint32) kvm.MemoryRegion {
	t.Helper()
	r := v.mem.Regions()[i]
	mr := kvm.MemoryRegion{Slot: slot, Flags: flags, GuestPhysAddr: uint64(r.Base()), Memory: r.Bytes()}
	if err := v.vm.SetUserMemoryRegion(mr); err != nil {
		t.Fatal(err)
	}
	v.slots[slot] = mr
	return mr
}

// lockThread pins the test goroutine to its OS thread for the rest of the
// test: KVM ties a vCPU to the thread that runs it.
func lockThread(t *testing.T) {
	runtime.LockOSThread()
	t.Cleanup(runtime.UnlockOSThread)
}

// ioExit is one OUT the guest made: its port and value (little-endian).
type ioExit struct {
	port  uint16
	value uint32
}

// runToOut runs cpu until its next OUT exit and returns it; any other exit
// except EINTR's is a failure.
func runToOut(t *testing.T, cpu *kvm.VCPU) ioExit {
	t.Helper()
	for range 100 {
		reason, err := cpu.Run()
		if err != nil {
			t.Fatal(err)
		}
		switch reason {
		case kvm.ExitIntr:
			continue
		case kvm.ExitIO:
			io, err := cpu.IO()
			if err != nil {
				t.Fatal(err)
			}
			if !io.Out {
				t.Fatalf("IN from port %#x, want an OUT", io.Port)
			}
			var v [4]byte
			copy(v[:], io.Data)
			return ioExit{io.Port, binary.LittleEndian.Uint32(v[:])}
		default:
			regs, _ := cpu.Regs()
			t.Fatalf("exit %v at RIP %#x, want an OUT", reason, regs.RIP)
		}
	}
	t.Fatal("no OUT after 100 runs")
	return ioExit{}
}

// runToHLT runs cpu until it halts.
func runToHLT(t *testing.T, cpu *kvm.VCPU) {
	t.Helper()
	for range 100 {
		reason, err := cpu.Run()
		if err != nil {
			t.Fatal(err)
		}
		switch reason {
		case kvm.ExitIntr:
			continue
		case kvm.ExitHLT:
			return
		default:
			regs, _ := cpu.Regs()
			t.Fatalf("exit %v at RIP %#x, want HLT", reason, regs.RIP)
		}
	}
	t.Fatal("no HLT after 100 runs")
}

// newEventFD returns a non-blocking eventfd, closed at the end of the test.
func newEventFD(t *testing.T) int {
	t.Helper()
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

// eventCount reads and resets an eventfd's counter: 0 when it was never
// signalled.
func eventCount(t *testing.T, fd int) uint64 {
	t.Helper()
	var b [8]byte
	_, err := unix.Read(fd, b[:])
	if errors.Is(err, unix.EAGAIN) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return binary.LittleEndian.Uint64(b[:])
}
