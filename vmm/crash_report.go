package vmm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"time"

	"tern/vmm/kvm"
	"tern/vmm/vcpu"
)

// CrashError is Run's error when a vCPU hit an exit tern cannot continue
// from (a triple fault, KVM's internal error, a failed entry, an exit
// tern does not handle): the vCPU's error, with the report captured once
// every vCPU had stopped. errors.Is sees through it to vcpu.ErrShutdown
// or vcpu.ErrInternal; its Error is the cause's, then the report.
type CrashError struct {
	Err    error
	Report CrashReport
}

func (e *CrashError) Error() string { return e.Err.Error() + "\n" + e.Report.String() }
func (e *CrashError) Unwrap() error { return e.Err }

// CrashReport is what the VM looked like when it crashed: every vCPU's
// registers, segments and control registers, MP state, pending events,
// local APIC and last exits, the IOAPIC's live pins, and what had been
// done to the VM (booted, restored by a migration, paused, resumed).
type CrashReport struct {
	VCPUs   []VCPUCrash
	IOAPIC  []IOAPICPin // only pins unmasked or awaiting an EOI; nil without an irqchip
	History []HistoryEvent
	// Missing says what could not be read, if anything.
	Missing []string
}

// VCPUCrash is one vCPU in a crash report.
type VCPUCrash struct {
	ID     int
	Regs   kvm.Regs
	Sregs  kvm.Sregs
	MP     kvm.MPState
	Events kvm.VCPUEvents
	// LAPIC is nil without an in-kernel irqchip.
	LAPIC *kvm.LAPICState
	Exits []vcpu.Exit
}

// ResetByKVM reports whether the vCPU's state is the reset state after a
// shutdown: KVM on AMD SVM resets a vCPU before it reports
// KVM_EXIT_SHUTDOWN (the VMCB is undefined after one), so its registers
// at the fault are lost, and the report says so. Its events and the last
// exits, which tern keeps, still tell something.
func (c VCPUCrash) ResetByKVM() bool {
	n := len(c.Exits)
	return n > 0 && c.Exits[n-1].Reason == kvm.ExitShutdown &&
		c.Regs.RIP == 0xfff0 && c.Sregs.CS.Selector == 0xf000 && c.Sregs.CR0&1 == 0
}

// IOAPICPin is one IOAPIC redirection entry.
type IOAPICPin struct {
	Pin   int
	Entry uint64
}

// HistoryEvent is one thing done to the VM.
type HistoryEvent struct {
	At   time.Time
	What string
}

// historyLen bounds the VM's history: the first events (how it began)
// and the last ones are kept, the middle counted.
const historyLen = 16

// note records what was done to the VM, for a crash report.
func (vm *VM) note(what string) {
	vm.histMu.Lock()
	defer vm.histMu.Unlock()
	e := HistoryEvent{At: time.Now(), What: what}
	if len(vm.history) < historyLen {
		vm.history = append(vm.history, e)
		return
	}
	// Keep the first four; shift the rest.
	copy(vm.history[4:], vm.history[5:])
	vm.history[historyLen-1] = e
	vm.historyDropped++
}

func (vm *VM) historyCopy() ([]HistoryEvent, int) {
	vm.histMu.Lock()
	defer vm.histMu.Unlock()
	return append([]HistoryEvent(nil), vm.history...), vm.historyDropped
}

// isCrash reports whether err ended a vCPU in a way a crash report
// explains.
func isCrash(err error) bool {
	return errors.Is(err, vcpu.ErrShutdown) || errors.Is(err, vcpu.ErrInternal)
}

// crashReport captures the report; every vCPU goroutine has ended, so
// their vCPUs are at rest and may be read from this thread.
func (vm *VM) crashReport(vcpus []*vcpu.VCPU) CrashReport {
	var r CrashReport
	missing := func(what string, err error) { r.Missing = append(r.Missing, fmt.Sprintf("%s: %v", what, err)) }
	for _, v := range vcpus {
		cpu := v.KVM()
		c := VCPUCrash{ID: cpu.ID(), Exits: v.LastExits()}
		var err error
		if c.Regs, err = cpu.Regs(); err != nil {
			missing(fmt.Sprintf("vCPU %d registers", c.ID), err)
		}
		if c.Sregs, err = cpu.Sregs(); err != nil {
			missing(fmt.Sprintf("vCPU %d segments", c.ID), err)
		}
		if c.MP, err = cpu.MPState(); err != nil {
			missing(fmt.Sprintf("vCPU %d MP state", c.ID), err)
		}
		if c.Events, err = cpu.VCPUEvents(); err != nil {
			missing(fmt.Sprintf("vCPU %d events", c.ID), err)
		}
		switch l, err := cpu.LAPIC(); {
		case errors.Is(err, kvm.ErrNoIRQChip):
		case err != nil:
			missing(fmt.Sprintf("vCPU %d LAPIC", c.ID), err)
		default:
			c.LAPIC = &l
		}
		r.VCPUs = append(r.VCPUs, c)
	}
	if vm.irqchip {
		st, err := vm.kvm.IRQChip(kvm.IRQChipIOAPIC)
		if err != nil {
			missing("IOAPIC", err)
		} else {
			r.IOAPIC = ioapicPins(st)
		}
	}
	var dropped int
	r.History, dropped = vm.historyCopy()
	if dropped > 0 {
		r.History = append(r.History[:4:4], append([]HistoryEvent{{What: fmt.Sprintf("(%d more)", dropped)}}, r.History[4:]...)...)
	}
	return r
}

// ioapicPins reads struct kvm_ioapic_state's redirection table (24
// entries from byte 24) and keeps the pins that are unmasked or await an
// EOI (remote IRR).
func ioapicPins(st kvm.IRQChipState) []IOAPICPin {
	pins := []IOAPICPin{}
	for pin := range 24 {
		e := binary.LittleEndian.Uint64(st.Chip[24+8*pin:])
		masked, remoteIRR := e&(1<<16) != 0, e&(1<<14) != 0
		if !masked || remoteIRR {
			pins = append(pins, IOAPICPin{Pin: pin, Entry: e})
		}
	}
	return pins
}

// String is the report in a few lines: the history, then each vCPU (its
// registers and segments; its events; its LAPIC; its last exits), then
// the IOAPIC's live pins.
func (r CrashReport) String() string {
	var b strings.Builder
	b.WriteString("crash report:")
	if len(r.History) > 0 {
		b.WriteString("\n  history:")
		for i, h := range r.History {
			if i > 0 {
				b.WriteString(";")
			}
			if h.At.IsZero() {
				fmt.Fprintf(&b, " %s", h.What)
			} else {
				fmt.Fprintf(&b, " %s %s", h.At.UTC().Format("15:04:05.000"), h.What)
			}
		}
	}
	for _, c := range r.VCPUs {
		b.WriteString("\n")
		c.write(&b)
	}
	if r.IOAPIC != nil {
		b.WriteString("\n  ioapic:")
		if len(r.IOAPIC) == 0 {
			b.WriteString(" every pin masked")
		}
		for _, p := range r.IOAPIC {
			e := p.Entry
			trigger := "edge"
			if e&(1<<15) != 0 {
				trigger = "level"
			}
			fmt.Fprintf(&b, " pin%d vec=%#x %s dest=%d masked=%d remote_irr=%d;", p.Pin, e&0xff, trigger, e>>56, e>>16&1, e>>14&1)
		}
	}
	for _, m := range r.Missing {
		fmt.Fprintf(&b, "\n  not read: %s", m)
	}
	return b.String()
}

var mpNames = map[kvm.MPState]string{
	kvm.MPStateRunnable: "runnable", kvm.MPStateUninitialized: "uninitialized",
	kvm.MPStateInitReceived: "init-received", kvm.MPStateHalted: "halted", kvm.MPStateSIPIReceived: "sipi-received",
}

func (c VCPUCrash) write(b *strings.Builder) {
	r, s := c.Regs, c.Sregs
	mp := mpNames[c.MP]
	if mp == "" {
		mp = fmt.Sprintf("%d", c.MP)
	}
	fmt.Fprintf(b, "  vCPU %d: mp=%s rip=%#x rsp=%#x rflags=%#x rax=%#x rbx=%#x rcx=%#x rdx=%#x rsi=%#x rdi=%#x rbp=%#x",
		c.ID, mp, r.RIP, r.RSP, r.RFLAGS, r.RAX, r.RBX, r.RCX, r.RDX, r.RSI, r.RDI, r.RBP)
	fmt.Fprintf(b, "\n    cr0=%#x cr2=%#x cr3=%#x cr4=%#x cr8=%#x efer=%#x apic_base=%#x cs=%#x(l=%d dpl=%d) ss=%#x tr=%#x gdt=%#x/%#x idt=%#x/%#x",
		s.CR0, s.CR2, s.CR3, s.CR4, s.CR8, s.EFER, s.APICBase, s.CS.Selector, s.CS.L, s.CS.DPL, s.SS.Selector, s.TR.Selector,
		s.GDT.Base, s.GDT.Limit, s.IDT.Base, s.IDT.Limit)
	if c.ResetByKVM() {
		b.WriteString("\n    (reset by KVM before it reported the shutdown, as on AMD SVM: the state at the fault is lost)")
	}
	e := c.Events
	fmt.Fprintf(b, "\n    events: exception(injected=%d pending=%d nr=%d error=%#x) interrupt(injected=%d nr=%d shadow=%d) nmi(injected=%d pending=%d masked=%d) sipi_vector=%#x triple_fault_pending=%d",
		e.Exception.Injected, e.Exception.Pending, e.Exception.Nr, e.Exception.ErrorCode,
		e.Interrupt.Injected, e.Interrupt.Nr, e.Interrupt.Shadow, e.NMI.Injected, e.NMI.Pending, e.NMI.Masked, e.SIPIVector, e.TripleFaultPending)
	if l := c.LAPIC; l != nil {
		reg := func(off int) uint32 { return binary.LittleEndian.Uint32(l.Regs[off:]) }
		fmt.Fprintf(b, "\n    lapic: id=%d tpr=%#x svr=%#x icr=%#x:%08x lvt_timer=%#x lint0=%#x lint1=%#x lvt_error=%#x esr=%#x timer_initial=%d timer_current=%d irr=%s isr=%s tmr=%s",
			reg(0x20)>>24, reg(0x80), reg(0xf0), reg(0x310), reg(0x300), reg(0x320), reg(0x350), reg(0x360), reg(0x370), reg(0x280),
			reg(0x380), reg(0x390), vectors(reg, 0x200), vectors(reg, 0x100), vectors(reg, 0x180))
	}
	if len(c.Exits) > 0 {
		b.WriteString("\n    last exits:")
		for i, x := range c.Exits {
			if i > 0 {
				b.WriteString(",")
			}
			fmt.Fprintf(b, " %s", x)
		}
	}
}

// vectors lists the vectors set in a LAPIC 256-bit register (eight 32-bit
// words at 16-byte strides from base): IRR, ISR or TMR.
func vectors(reg func(int) uint32, base int) string {
	var set []string
	for w := range 8 {
		bits := reg(base + 16*w)
		for bit := range 32 {
			if bits&(1<<bit) != 0 {
				set = append(set, fmt.Sprintf("%#x", w*32+bit))
			}
		}
	}
	return "[" + strings.Join(set, " ") + "]"
}
