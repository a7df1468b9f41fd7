package selftest

import (
	"bytes"
	"runtime"
	"testing"

	"tern/vmm/boot"
	"tern/vmm/guests"
	"tern/vmm/kvm"
	"tern/vmm/kvm/kvmtest"
	"tern/vmm/memory"
)

func TestMain(m *testing.M) { kvmtest.Main(m) }

// newVM opens KVM and creates a VM with RAM of size bytes at guest-physical
// 0, mapped as slot 0; everything is closed at the end of the test.
func newVM(t *testing.T, size uint64) (*kvm.System, *kvm.VM, *memory.Memory) {
	t.Helper()
	kvmtest.Require(t)
	sys, err := kvm.Open()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sys.Close() })
	mem, err := memory.New(memory.RegionSpec{Name: "ram", Size: size})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mem.Close() })
	vm, err := sys.CreateVM()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { vm.Close() }) // runs before mem.Close
	if err := vm.SetUserMemoryRegion(kvm.MemoryRegion{Slot: 0, Memory: mem.Regions()[0].Bytes()}); err != nil {
		t.Fatal(err)
	}
	return sys, vm, mem
}

// realModeHello writes "KVM\n" to port 0x3f8 one byte at a time and halts.
var realModeHello = []byte{
	0xba, 0xf8, 0x03, // mov dx, 0x3f8
	0xb0, 'K', 0xee, // mov al, 'K'; out dx, al
	0xb0, 'V', 0xee,
	0xb0, 'M', 0xee,
	0xb0, '\n', 0xee,
	0xf4, // hlt
}

func TestRealModeGuestWritesSerialAndHalts(t *testing.T) {
	_, vm, mem := newVM(t, memory.PageSize)
	if err := mem.Write(0, realModeHello); err != nil {
		t.Fatal(err)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cpu, err := vm.CreateVCPU(0)
	if err != nil {
		t.Fatal(err)
	}
	if err := kvm.StartRealMode(cpu, 0); err != nil {
		t.Fatal(err)
	}
	var serial bytes.Buffer
	for exits := 0; ; exits++ {
		if exits > 100 {
			t.Fatalf("no HLT after %d exits; serial so far %q", exits, serial.String())
		}
		reason, err := cpu.Run()
		if err != nil {
			t.Fatal(err)
		}
		if reason == kvm.ExitHLT {
			break
		}
		if reason != kvm.ExitIO {
			t.Fatalf("exit %v, want IO or HLT", reason)
		}
		io, err := cpu.IO()
		if err != nil {
			t.Fatal(err)
		}
		if io.Port != 0x3f8 || !io.Out || io.Size != 1 {
			t.Fatalf("IO exit %+v, want a 1-byte OUT to 0x3f8", io)
		}
		serial.Write(io.Data)
	}
	if got := serial.String(); got != "KVM\n" {
		t.Fatalf("serial = %q, want %q", got, "KVM\n")
	}
	regs, err := cpu.Regs()
	if err != nil {
		t.Fatal(err)
	}
	if want := uint64(len(realModeHello)); regs.RIP != want {
		t.Errorf("RIP after HLT = %#x, want %#x", regs.RIP, want)
	}
}

// 8250 UART registers and the exit port the guests use (vmm/guests).
const (
	uartData       = 0x3f8
	uartLineCtrl   = 0x3fb
	uartLineStatus = 0x3fd
	lcrDLAB        = 0x80 // data port holds the divisor latch, not a byte to send
	lsrTHREmpty    = 0x60 // THRE | TEMT: ready for the next byte
	debugExitPort  = 0xf4
	bootTimerAddr  = 0xC0000000
)

func TestLongModeHelloGuestWithCPUID(t *testing.T) {
	sys, vm, mem := newVM(t, 4<<20)
	elf, err := guests.ELF("hello")
	if err != nil {
		t.Fatal(err)
	}
	_, state, err := boot.LoadGuest(mem, elf)
	if err != nil {
		t.Fatal(err)
	}
	cpuid, err := sys.SupportedCPUID()
	if err != nil {
		t.Fatal(err)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cpu, err := vm.CreateVCPU(0)
	if err != nil {
		t.Fatal(err)
	}
	if err := cpu.SetCPUID2(cpuid); err != nil {
		t.Fatal(err)
	}
	if err := applyState(cpu, state); err != nil {
		t.Fatal(err)
	}
	var serial bytes.Buffer
	bootTimer := -1
	var lcr byte
	for exits := 0; ; exits++ {
		if exits > 10000 {
			t.Fatalf("guest did not exit after %d exits; serial so far %q", exits, serial.String())
		}
		reason, err := cpu.Run()
		if err != nil {
			t.Fatal(err)
		}
		switch reason {
		case kvm.ExitIO:
			io, err := cpu.IO()
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case io.Out && io.Port == uartLineCtrl:
				lcr = io.Data[0]
			case io.Out && io.Port == uartData && lcr&lcrDLAB == 0:
				serial.Write(io.Data)
			case !io.Out && io.Port == uartLineStatus:
				io.Data[0] = lsrTHREmpty
			case io.Out && io.Port == debugExitPort:
				if got := serial.String(); got != "Hello from the tern test guest\r\n" {
					t.Errorf("serial = %q", got)
				}
				if bootTimer != 123 {
					t.Errorf("boot timer byte = %d, want 123", bootTimer)
				}
				if io.Data[0] != 0 {
					t.Errorf("exit status %d, want 0", io.Data[0])
				}
				return
			case !io.Out:
				clear(io.Data) // other UART registers read as 0
			}
		case kvm.ExitMMIO:
			mmio, err := cpu.MMIO()
			if err != nil {
				t.Fatal(err)
			}
			if mmio.Write && mmio.Addr == bootTimerAddr && len(mmio.Data) == 1 {
				bootTimer = int(mmio.Data[0])
			}
		default:
			regs, _ := cpu.Regs()
			t.Fatalf("exit %v at RIP %#x; serial so far %q", reason, regs.RIP, serial.String())
		}
	}
}

// applyState loads vmm/boot's plain-data CPU state into the vCPU.
func applyState(cpu *kvm.VCPU, st boot.CPUState) error {
	sregs, err := cpu.Sregs()
	if err != nil {
		return err
	}
	sregs.CS, sregs.DS, sregs.ES, sregs.FS = st.CS, st.DS, st.ES, st.FS
	sregs.GS, sregs.SS, sregs.TR, sregs.LDT = st.GS, st.SS, st.TR, st.LDT
	sregs.GDT, sregs.IDT = st.GDT, st.IDT
	sregs.CR0, sregs.CR3, sregs.CR4, sregs.EFER = st.CR0, st.CR3, st.CR4, st.EFER
	if err := cpu.SetSregs(sregs); err != nil {
		return err
	}
	return cpu.SetRegs(kvm.Regs{RIP: st.RIP, RSP: st.RSP, RFLAGS: st.RFLAGS, RSI: st.RSI})
}
