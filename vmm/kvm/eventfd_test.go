package kvm_test

import (
	"errors"
	"os"
	"testing"
	"time"

	"tern/vmm/kvm"
	"tern/vmm/memory"
)

// newKVMEventFD returns an EventFD closed at the end of the test.
func newKVMEventFD(t *testing.T) *kvm.EventFD {
	t.Helper()
	e, err := kvm.NewEventFD()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// readAsync starts a Read of e and returns where its result arrives.
func readAsync(e *kvm.EventFD) <-chan readResult {
	out := make(chan readResult, 1)
	go func() {
		n, err := e.Read()
		out <- readResult{n, err}
	}()
	return out
}

type readResult struct {
	n   uint64
	err error
}

// awaitRead waits for a Read started with readAsync, failing after a
// generous bound that says what it waited for.
func awaitRead(t *testing.T, what string, c <-chan readResult) readResult {
	t.Helper()
	select {
	case r := <-c:
		return r
	case <-time.After(10 * time.Second):
		t.Fatalf("no Read result within 10s: %s", what)
		return readResult{}
	}
}

func TestEventFDCountsSignalsAndCloseWakesARead(t *testing.T) {
	e := newKVMEventFD(t)
	for range 3 {
		if err := e.Signal(); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := e.Read(); err != nil || n != 3 {
		t.Fatalf("Read after 3 signals = %d, %v; want 3", n, err)
	}
	// The counter is reset: a Read now waits until the next Signal.
	pending := readAsync(e)
	select {
	case r := <-pending:
		t.Fatalf("Read of a reset counter returned %d, %v without a signal", r.n, r.err)
	default:
	}
	if err := e.Signal(); err != nil {
		t.Fatal(err)
	}
	if r := awaitRead(t, "the signal after a reset", pending); r.err != nil || r.n != 1 {
		t.Fatalf("Read = %d, %v; want 1", r.n, r.err)
	}
	blocked := readAsync(e)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if r := awaitRead(t, "Close to wake a blocked Read", blocked); !errors.Is(r.err, os.ErrClosed) {
		t.Fatalf("Read during Close = %d, %v; want os.ErrClosed", r.n, r.err)
	}
	if err := e.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// A virtio-mmio slot's interrupt line (vmm.VirtioSlotGSI(0)), and a
// QueueNotify register's guest-physical address outside the test's RAM.
const (
	slotGSI        = 16
	queueNotifyGPA = 0x1050
)

// mmioNotifyGuest is real-mode code that writes the 32-bit values 1, then
// 0 to queueNotifyGPA (as a virtio-mmio driver notifies queue 1, then
// queue 0), then OUTs to roundDonePort (the test runs it no further).
var mmioNotifyGuest = []byte{
	0x66, 0xb8, 0x01, 0x00, 0x00, 0x00, // mov eax, 1
	0x66, 0xa3, queueNotifyGPA & 0xff, queueNotifyGPA >> 8, // mov [queueNotifyGPA], eax
	0x66, 0x31, 0xc0, // xor eax, eax
	0x66, 0xa3, queueNotifyGPA & 0xff, queueNotifyGPA >> 8, // mov [queueNotifyGPA], eax
	0xe6, roundDonePort, // out roundDonePort, al
}

// TestIRQFDOnASlotGSIAndAnMMIOIOEventFD wires an EventFD the way tern
// wires a Linux guest's virtio device: an irqfd on an IOAPIC pin of the
// in-kernel irqchip, which KVM consumes when signalled, and an ioeventfd
// on a QueueNotify register that matches queue 0's 4-byte write, which a
// Read blocked before the guest ran sees.
func TestIRQFDOnASlotGSIAndAnMMIOIOEventFD(t *testing.T) {
	v := newTestVM(t, (*kvm.VM).CreateIRQChip, memory.RegionSpec{Name: "ram", Size: memory.PageSize})
	irq := newKVMEventFD(t)
	if err := v.vm.AssignIRQFD(irq.Fd(), slotGSI); err != nil {
		t.Fatal(err)
	}
	if err := irq.Signal(); err != nil {
		t.Fatal(err)
	}
	// KVM's irqfd takes the count in the signal's wake-up, as it pulses
	// the line: nothing is left to read.
	if n := eventCount(t, irq.Fd()); n != 0 {
		t.Fatalf("irqfd counter %d after a signal, want 0 (KVM did not consume it)", n)
	}

	if err := v.mem.Write(0, mmioNotifyGuest); err != nil {
		t.Fatal(err)
	}
	v.addSlot(t, 0, 0, 0)
	kick := newKVMEventFD(t)
	queue0 := uint64(0)
	ev := kvm.IOEventFD{Addr: queueNotifyGPA, Len: 4, Datamatch: &queue0, FD: kick.Fd()}
	if err := v.vm.AssignIOEventFD(ev); err != nil {
		t.Fatal(err)
	}
	kicked := readAsync(kick)
	lockThread(t)
	cpu, err := v.vm.CreateVCPU(0)
	if err != nil {
		t.Fatal(err)
	}
	if err := kvm.StartRealMode(cpu, 0); err != nil {
		t.Fatal(err)
	}
	// Queue 1's write does not match: an ordinary MMIO exit.
	reason, err := runPastIntr(cpu)
	if err != nil || reason != kvm.ExitMMIO {
		t.Fatalf("first exit = %v, %v; want the unmatched MMIO write", reason, err)
	}
	if m, err := cpu.MMIO(); err != nil || !m.Write || m.Addr != queueNotifyGPA || len(m.Data) != 4 || m.Data[0] != 1 {
		t.Fatalf("MMIO exit = %+v, %v; want the 4-byte write of 1 at %#x", m, err, queueNotifyGPA)
	}
	select {
	case r := <-kicked:
		t.Fatalf("the unmatched write signalled the ioeventfd: %d, %v", r.n, r.err)
	default:
	}
	// Queue 0's write matches and does not exit.
	if out := runToOut(t, cpu); out.port != roundDonePort {
		t.Fatalf("second exit = %+v, want the OUT to %#x (the matched write must not exit)", out, roundDonePort)
	}
	if r := awaitRead(t, "the guest's matched QueueNotify write", kicked); r.err != nil || r.n != 1 {
		t.Fatalf("ioeventfd Read = %d, %v; want 1", r.n, r.err)
	}
	// No HLT: with the in-kernel irqchip KVM would sleep the vCPU there.
	if err := v.vm.DeassignIOEventFD(ev); err != nil {
		t.Fatal(err)
	}
	if err := v.vm.DeassignIRQFD(irq.Fd(), slotGSI); err != nil {
		t.Fatal(err)
	}
}

// runPastIntr runs cpu until an exit other than EINTR's.
func runPastIntr(cpu *kvm.VCPU) (kvm.ExitReason, error) {
	for {
		reason, err := cpu.Run()
		if err != nil || reason != kvm.ExitIntr {
			return reason, err
		}
	}
}
