package kvm

import (
	"fmt"
)

// CreateIRQChip creates the in-kernel interrupt controllers: a PIC pair,
// an IOAPIC and a local APIC per vCPU (KVM_CREATE_IRQCHIP). Call it before
// creating vCPUs. With it, KVM handles a guest's HLT itself (the vCPU
// sleeps until an interrupt), so HLT no longer exits to user space.
func (vm *VM) CreateIRQChip() error {
	const op = "creating in-kernel irqchip"
	if _, err := vm.requireVM(op, CapIRQChip); err != nil {
		return err
	}
	fd, err := vm.rawFd()
	if err != nil {
		return err
	}
	if _, err := ioctl(fd, kvmCreateIRQChip, 0); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	return nil
}

// IRQLine sets the level of interrupt line gsi of the in-kernel irqchip
// (KVM_IRQ_LINE): high true, low false. An edge-triggered line is pulsed
// by raising and lowering it.
func (vm *VM) IRQLine(gsi uint32, high bool) error {
	fd, err := vm.rawFd()
	if err != nil {
		return err
	}
	arg := irqLevel{IRQ: gsi}
	if high {
		arg.Level = 1
	}
	if err := ioctlPtr(fd, kvmIRQLine, &arg); err != nil {
		return fmt.Errorf("setting IRQ line %d to %d: %w", gsi, arg.Level, err)
	}
	return nil
}

// CreatePIT2 creates the in-kernel i8254 timer (KVM_CREATE_PIT2), after
// CreateIRQChip. flags are KVM_PIT_SPEAKER_DUMMY (1) or 0.
func (vm *VM) CreatePIT2(flags uint32) error {
	const op = "creating in-kernel PIT"
	if _, err := vm.requireVM(op, CapPIT2); err != nil {
		return err
	}
	fd, err := vm.rawFd()
	if err != nil {
		return err
	}
	arg := pitConfig{Flags: flags}
	if err := ioctlPtr(fd, kvmCreatePIT2, &arg); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	return nil
}

// IRQChip reads in-kernel interrupt controller chip (KVM_GET_IRQCHIP):
// IRQChipPICMaster, IRQChipPICSlave or IRQChipIOAPIC.
func (vm *VM) IRQChip(chip uint32) (IRQChipState, error) {
	st := IRQChipState{ChipID: chip}
	fd, err := vm.rawFd()
	if err != nil {
		return st, err
	}
	if err := ioctlPtr(fd, kvmGetIRQChip, &st); err != nil {
		return st, opError(fmt.Sprintf("getting irqchip %d", chip), err, CapIRQChip)
	}
	return st, nil
}

// SetIRQChip loads the controller st.ChipID names (KVM_SET_IRQCHIP).
func (vm *VM) SetIRQChip(st IRQChipState) error {
	fd, err := vm.rawFd()
	if err != nil {
		return err
	}
	if err := ioctlPtr(fd, kvmSetIRQChip, &st); err != nil {
		return opError(fmt.Sprintf("setting irqchip %d", st.ChipID), err, CapIRQChip)
	}
	return nil
}

// PIT reads the in-kernel i8254 (KVM_GET_PIT2).
func (vm *VM) PIT() (PITState, error) {
	var st PITState
	fd, err := vm.rawFd()
	if err != nil {
		return st, err
	}
	if err := ioctlPtr(fd, kvmGetPIT2, &st); err != nil {
		return st, opError("getting PIT state", err, CapPIT2)
	}
	return st, nil
}

// SetPIT loads the in-kernel i8254 (KVM_SET_PIT2).
func (vm *VM) SetPIT(st PITState) error {
	fd, err := vm.rawFd()
	if err != nil {
		return err
	}
	if err := ioctlPtr(fd, kvmSetPIT2, &st); err != nil {
		return opError("setting PIT state", err, CapPIT2)
	}
	return nil
}

// AssignIRQFD makes a write to eventfd efd raise interrupt line gsi of the
// in-kernel irqchip (KVM_IRQFD). The caller keeps owning efd.
func (vm *VM) AssignIRQFD(efd int, gsi uint32) error {
	return vm.irqfd("assigning irqfd", efd, gsi, 0)
}

// DeassignIRQFD undoes AssignIRQFD for the same efd and gsi.
func (vm *VM) DeassignIRQFD(efd int, gsi uint32) error {
	return vm.irqfd("deassigning irqfd", efd, gsi, irqfdFlagDeassign)
}

func (vm *VM) irqfd(op string, efd int, gsi, flags uint32) error {
	if _, err := vm.requireVM(op, CapIRQFD); err != nil {
		return err
	}
	fd, err := vm.rawFd()
	if err != nil {
		return err
	}
	if efd < 0 {
		return fmt.Errorf("%s for GSI %d: bad eventfd %d", op, gsi, efd)
	}
	arg := irqfdArg{FD: uint32(efd), GSI: gsi, Flags: flags}
	if err := ioctlPtr(fd, kvmIRQFD, &arg); err != nil {
		return fmt.Errorf("%s for GSI %d: %w", op, gsi, err)
	}
	return nil
}

// IOEventFD describes a guest write that KVM turns into an eventfd signal
// without an exit to user space (KVM_IOEVENTFD).
type IOEventFD struct {
	// Addr is the port (PIO) or guest-physical address (MMIO).
	Addr uint64
	// Len is the access size that matches: 1, 2, 4 or 8 bytes, or 0 for
	// any (MMIO only, with KVM_CAP_IOEVENTFD_ANY_LENGTH).
	Len uint32
	// PIO selects the port space; otherwise Addr is MMIO.
	PIO bool
	// Datamatch, when set, restricts the match to writes of that value.
	Datamatch *uint64
	// FD is the eventfd to signal; the caller keeps owning it.
	FD int
}

// AssignIOEventFD registers e (KVM_IOEVENTFD).
func (vm *VM) AssignIOEventFD(e IOEventFD) error {
	return vm.ioeventfd("assigning ioeventfd", e, 0)
}

// DeassignIOEventFD removes a registration made with the same e.
func (vm *VM) DeassignIOEventFD(e IOEventFD) error {
	return vm.ioeventfd("deassigning ioeventfd", e, ioeventfdFlagDeassign)
}

func (vm *VM) ioeventfd(op string, e IOEventFD, flags uint32) error {
	if _, err := vm.requireVM(op, CapIOEventFD); err != nil {
		return err
	}
	fd, err := vm.rawFd()
	if err != nil {
		return err
	}
	arg := ioeventfdArg{Addr: e.Addr, Len: e.Len, FD: int32(e.FD), Flags: flags}
	if e.PIO {
		arg.Flags |= ioeventfdFlagPIO
	}
	if e.Datamatch != nil {
		arg.Flags |= ioeventfdFlagDatamatch
		arg.Datamatch = *e.Datamatch
	}
	if err := ioctlPtr(fd, kvmIOEventFD, &arg); err != nil {
		return fmt.Errorf("%s at %#x: %w", op, e.Addr, err)
	}
	return nil
}
