package vcpu

import (
	"fmt"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"tern/vmm/kvm"
	"tern/vmm/kvm/kvmtest"
)

// With KVM's in-kernel irqchip every vCPU but the first starts in
// KVM_MP_STATE_UNINITIALIZED: KVM_RUN blocks in the kernel until another
// vCPU's local APIC sends it INIT and a start-up IPI, which is how a
// Linux guest starts its application processors. These tests run such a
// vCPU through the goroutine's own loop.

// apDeadline bounds each wait here, for a busy machine and the emulated
// host.
const apDeadline = 2 * time.Minute

// smpVM is a VM with the in-kernel irqchip and RAM at [0x1000, 0x3000):
// the first vCPU's code at 0x1000, an application processor's at 0x2000
// (the start-up IPI's vector 2).
type smpVM struct {
	vm *kvm.VM
}

func newSMPVM(t *testing.T, bsp, ap []byte) *smpVM {
	t.Helper()
	sys, err := kvm.Open()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sys.Close() })
	vm, err := sys.CreateVM()
	if err != nil {
		t.Fatal(err)
	}
	mem, err := unix.Mmap(-1, 0, 0x2000, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(mem) })
	t.Cleanup(func() { vm.Close() })
	copy(mem, bsp)
	copy(mem[0x1000:], ap)
	if err := vm.SetUserMemoryRegion(kvm.MemoryRegion{GuestPhysAddr: 0x1000, Memory: mem}); err != nil {
		t.Fatal(err)
	}
	if err := vm.CreateIRQChip(); err != nil {
		t.Fatal(err)
	}
	return &smpVM{vm: vm}
}

// bspCreate creates vCPU 0 in real mode at 0x1000 with DS based at the
// local APIC's window, so that [ds:0x300] is its interrupt command
// register.
func (s *smpVM) bspCreate() (*kvm.VCPU, error) {
	cpu, err := s.vm.CreateVCPU(0)
	if err != nil {
		return nil, err
	}
	if err := kvm.StartRealMode(cpu, 0x1000); err != nil {
		return nil, err
	}
	sr, err := cpu.Sregs()
	if err != nil {
		return nil, err
	}
	sr.DS.Base = 0xfee00000
	return cpu, cpu.SetSregs(sr)
}

// apCreate creates vCPU 1 and leaves it as KVM made it, checking that it
// waits for its start-up IPI.
func (s *smpVM) apCreate() (*kvm.VCPU, error) {
	cpu, err := s.vm.CreateVCPU(1)
	if err != nil {
		return nil, err
	}
	st, err := cpu.MPState()
	if err != nil {
		return nil, err
	}
	if st != kvm.MPStateUninitialized {
		return nil, fmt.Errorf("vCPU 1 starts in MP state %d, want KVM_MP_STATE_UNINITIALIZED", st)
	}
	return cpu, nil
}

// within runs f and fails the test if it does not return within
// apDeadline, saying what it waited for.
func within(t *testing.T, what string, f func() error) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	case <-time.After(apDeadline):
		t.Fatalf("%s: not done within %v", what, apDeadline)
	}
}

func TestAPWaitingForItsSIPIPausesResumesAndStops(t *testing.T) {
	kvmtest.Require(t)
	s := newSMPVM(t, nil, nil)
	v, err := Start(Config{Create: s.apCreate})
	if err != nil {
		t.Fatal(err)
	}
	// Running from Start: the goroutine is in KVM_RUN, blocked in the
	// kernel, or about to be. A pause must get it out and park it.
	for i := range 3 {
		within(t, fmt.Sprintf("pause %d of a vCPU waiting for its SIPI", i), v.Pause)
		st, err := v.KVM().MPState()
		if err != nil {
			t.Fatal(err)
		}
		if st != kvm.MPStateUninitialized {
			t.Fatalf("paused, it is in MP state %d, want still KVM_MP_STATE_UNINITIALIZED", st)
		}
		if err := v.Resume(); err != nil {
			t.Fatalf("resume %d: %v", i, err)
		}
	}
	v.Stop()
	within(t, "the goroutine's end after Stop", v.Wait)
}

// portRecorder sends every byte written to its port.
type portRecorder chan byte

func (p portRecorder) ReadPort(uint16, []byte) {}
func (p portRecorder) WritePort(_ uint16, data []byte) {
	select {
	case p <- data[0]:
	default:
	}
}

func TestAPStartsAtTheVectorOfItsSIPI(t *testing.T) {
	kvmtest.Require(t)
	bsp := []byte{
		0x66, 0xc7, 0x06, 0x10, 0x03, 0x00, 0x00, 0x00, 0x01, // mov dword [0x310], 1<<24: destination APIC ID 1
		0x66, 0xc7, 0x06, 0x00, 0x03, 0x00, 0x45, 0x00, 0x00, // mov dword [0x300], 0x4500: INIT, assert
		0x66, 0xc7, 0x06, 0x00, 0x03, 0x02, 0x46, 0x00, 0x00, // mov dword [0x300], 0x4602: start-up, vector 2
		0xeb, 0xfe, // jmp $
	}
	ap := []byte{0xb0, 0x42, 0xe6, 0x80, 0xeb, 0xfe} // mov al, 0x42; out 0x80, al; jmp $
	s := newSMPVM(t, bsp, ap)
	rec := make(portRecorder, 1)
	var ports PortBus
	if err := ports.Register("recorder", 0x80, 1, rec); err != nil {
		t.Fatal(err)
	}
	a, err := Start(Config{Create: s.apCreate, Ports: &ports})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		a.Stop()
		within(t, "the AP's end after Stop", a.Wait)
	}()
	b, err := Start(Config{Create: s.bspCreate, Ports: &ports})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		b.Stop()
		within(t, "the BSP's end after Stop", b.Wait)
	}()
	select {
	case got := <-rec:
		if got != 0x42 {
			t.Fatalf("port 0x80 got %#x, want the AP's 0x42", got)
		}
	case <-a.Done():
		t.Fatalf("the AP ended before it wrote port 0x80: %v", a.Wait())
	case <-time.After(apDeadline):
		t.Fatalf("the AP wrote nothing to port 0x80 within %v of the BSP's INIT and SIPI", apDeadline)
	}
	within(t, "pausing the started AP", a.Pause)
	r, err := a.KVM().Regs()
	if err != nil {
		t.Fatal(err)
	}
	sr, err := a.KVM().Sregs()
	if err != nil {
		t.Fatal(err)
	}
	if sr.CS.Base != 0x2000 || r.RIP != 4 {
		t.Errorf("the AP is at CS base %#x RIP %#x, want 0x2000, 4 (its jmp $)", sr.CS.Base, r.RIP)
	}
}
