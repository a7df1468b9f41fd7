package vmm

import (
	"errors"
	"fmt"

	"tern/vmm/acpi"
	"tern/vmm/boot"
	"tern/vmm/devices"
	"tern/vmm/kvm"
	"tern/vmm/memory"
)

// A Linux guest gets more of a PC than tern's own guests, which poll and
// never take an interrupt:
//
//   - KVM's in-kernel irqchip (PIC pair, IOAPIC, a local APIC per vCPU)
//     and PIT. Without a local APIC the kernel has no timer to tick with
//     and no reference to calibrate the TSC against; it was seen to stall
//     there ("tsc: Unable to calibrate against PIT") short of /init.
//   - CPUID that says "hypervisor" (leaf 1 ECX bit 31), so the kernel
//     reads KVM's leaves at 0x40000000 and uses kvmclock, which gives it
//     the TSC frequency without calibrating; and, where KVM emulates it,
//     the TSC-deadline timer (leaf 1 ECX bit 24), which needs no
//     calibration of the local APIC timer either. KVM_GET_SUPPORTED_CPUID
//     leaves both bits to the VMM.
//   - The UART's interrupt on IRQ 4 (COM1's), so that user space can
//     write to and read from the serial console, not only printk.
//   - ACPI tables (vmm/acpi) in the BIOS area at acpi.RSDPScanStart,
//     their RSDP also in boot_params.acpi_rsdp_addr: a MADT with one
//     local APIC per vCPU and the IOAPIC, a hardware-reduced FADT, and a
//     DSDT with COM1 (0x3f8, GSI 4) and one LNRO0005 device per occupied
//     virtio-mmio slot (its window and VirtioSlotGSI). Hardware-reduced,
//     the kernel routes every interrupt through the IOAPIC and leaves
//     the PIC and the PIT alone (the PIT stays, unused: KVM's PIT needs
//     nothing of the guest).
//   - SMP: vCPU 0 starts at the kernel's 64-bit entry; every other vCPU
//     stays as KVM creates it with the in-kernel irqchip, waiting in
//     KVM_MP_STATE_UNINITIALIZED until the kernel starts it through its
//     local APIC (INIT, start-up IPI), as firmware would leave it. CPUID
//     gives vCPU i APIC ID i (cpuidFor), the ID the MADT lists.

// CPUID bits tern sets for a Linux guest (leaf 1 ECX).
const (
	cpuidTSCDeadline = 1 << 24
	cpuidHypervisor  = 1 << 31
)

// uartIRQ is COM1's ISA interrupt line.
const uartIRQ = 4

// pitSpeakerDummy is KVM_PIT_SPEAKER_DUMMY: port 0x61 reads as a speaker
// that is not there, which the kernel's PIT code probes.
const pitSpeakerDummy = 1

// writeACPI builds the ACPI tables of a Linux guest with cfg's vCPUs and
// occupied virtio-mmio slots, writes them at acpi.RSDPScanStart (in the
// e820 map's reserved BIOS area) and records the RSDP in the zero page
// the loader placed.
func writeACPI(mem *memory.Memory, cfg Config) error {
	spec := acpi.Spec{
		VCPUs:   max(cfg.VCPUs, 1),
		Serials: []acpi.Serial{{Port: devices.UARTBase, GSI: uartIRQ}},
		Power: &acpi.Power{
			SleepControl: devices.SleepControlPort, SleepStatus: devices.SleepStatusPort,
			Reset: devices.ResetPort, ResetValue: devices.ResetValue, S5Type: devices.SleepTypeS5,
		},
	}
	for _, slot := range cfg.virtioSlotsInUse() {
		spec.VirtioMMIO = append(spec.VirtioMMIO, acpi.VirtioMMIO{
			Slot: slot, Base: VirtioSlotAddr(slot), Size: devices.MMIOSize, GSI: VirtioSlotGSI(slot),
		})
	}
	img, err := acpi.Build(acpi.RSDPScanStart, spec)
	if err != nil {
		return fmt.Errorf("building ACPI tables: %w", err)
	}
	if img.Base+uint64(len(img.Bytes)) > resetVector {
		return fmt.Errorf("placing ACPI tables: %d bytes from %#x reach the reset vector at %#x", len(img.Bytes), img.Base, resetVector)
	}
	if err := mem.Write(memory.GPA(img.Base), img.Bytes); err != nil {
		return fmt.Errorf("placing ACPI tables: %w", err)
	}
	if err := mem.Write(resetVector, resetStub); err != nil {
		return fmt.Errorf("placing the reset vector's code: %w", err)
	}
	return boot.SetACPIRSDP(mem, memory.GPA(img.RSDPAddr()))
}

// resetVector is where a PC's CPU starts after a reset, F000:FFF0 in real
// mode: the BIOS's first instruction. A Linux kernel that reboots the
// "BIOS" way (machine_real_restart) jumps there in real mode. On a
// hardware-reduced ACPI machine without EFI that is its default route:
// the kernel prefers EFI's reset when the FADT says hardware-reduced, and
// without EFI runtime services falls back to the BIOS, not to the FADT's
// reset register. There is no BIOS here, so tern puts resetStub there.
const resetVector = 0xffff0

// resetStub is real-mode code writing the ACPI reset value to the reset
// register, then halting, for a reboot through the reset vector.
var resetStub = []byte{
	0xba, devices.ResetPort & 0xff, devices.ResetPort >> 8, // mov dx, ResetPort
	0xb0, devices.ResetValue, // mov al, ResetValue
	0xee,       // out dx, al
	0xf4,       // hlt
	0xeb, 0xfd, // jmp back to the hlt
}

// PlatformState is a VM's in-kernel platform devices, what a live
// migration carries besides the vCPUs (whose local APICs are in their own
// state): the PIC pair and the IOAPIC, and a Linux guest's PIT.
type PlatformState struct {
	// IRQChips are the PIC master, the PIC slave and the IOAPIC, in that
	// order.
	IRQChips [3]kvm.IRQChipState
	// PIT is a Linux guest's i8254; nil for a VM without one (the smp
	// guest's).
	PIT *kvm.PITState
}

// platformChips are the chip IDs of PlatformState.IRQChips, in order.
var platformChips = [3]uint32{kvm.IRQChipPICMaster, kvm.IRQChipPICSlave, kvm.IRQChipIOAPIC}

// IsLinux reports whether the VM runs a Linux guest (Config.Linux): it has
// the in-kernel irqchip and PIT, asynchronous virtio and ACPI power.
func (vm *VM) IsLinux() bool { return vm.linux }

// PlatformState captures the irqchip and a Linux guest's PIT; nil for a
// VM without the irqchip (tern's own guests but smp). Call it with the VM
// paused.
func (vm *VM) PlatformState() (*PlatformState, error) {
	if !vm.irqchip {
		return nil, nil
	}
	st := &PlatformState{}
	for i, chip := range platformChips {
		c, err := vm.kvm.IRQChip(chip)
		if err != nil {
			return nil, fmt.Errorf("capturing the platform: %w", err)
		}
		st.IRQChips[i] = c
	}
	if !vm.linux {
		return st, nil
	}
	pit, err := vm.kvm.PIT()
	if err != nil {
		return nil, fmt.Errorf("capturing the platform: %w", err)
	}
	st.PIT = &pit
	return st, nil
}

// SetPlatformState loads st into a VM with the irqchip (before its
// vCPUs' state, whose local APICs take interrupts from these). A chip
// whose ID is not the one its place names is an error, and so is a PIT
// for a VM without one or none for a VM with one.
func (vm *VM) SetPlatformState(st *PlatformState) error {
	if !vm.irqchip {
		return errors.New("loading the platform: this VM has no irqchip")
	}
	if (st.PIT != nil) != vm.linux {
		return fmt.Errorf("loading the platform: PIT state given %v, but the VM has a PIT %v (only a Linux guest's has)", st.PIT != nil, vm.linux)
	}
	for i, chip := range platformChips {
		if st.IRQChips[i].ChipID != chip {
			return fmt.Errorf("loading the platform: irqchip %d in place %d, want chip %d", st.IRQChips[i].ChipID, i, chip)
		}
		if err := vm.kvm.SetIRQChip(st.IRQChips[i]); err != nil {
			return fmt.Errorf("loading the platform: %w", err)
		}
	}
	if st.PIT == nil {
		return nil
	}
	if err := vm.kvm.SetPIT(*st.PIT); err != nil {
		return fmt.Errorf("loading the platform: %w", err)
	}
	return nil
}

// createLinuxPlatform creates the in-kernel irqchip and PIT; before any
// vCPU exists.
func (vm *VM) createLinuxPlatform() error {
	vm.linux = true
	if err := vm.kvm.CreateIRQChip(); err != nil {
		return fmt.Errorf("creating a Linux guest's interrupt controllers: %w", err)
	}
	if err := vm.kvm.CreatePIT2(pitSpeakerDummy); err != nil {
		return fmt.Errorf("creating a Linux guest's timer: %w", err)
	}
	return nil
}

// linuxCPUID returns entries with the hypervisor bit, and the
// TSC-deadline bit when tscDeadline, set in leaf 1.
func linuxCPUID(entries []kvm.CPUIDEntry2, tscDeadline bool) []kvm.CPUIDEntry2 {
	if tscDeadline {
		entries = withTSCDeadline(entries)
	}
	for i := range entries {
		if entries[i].Function == 1 {
			entries[i].ECX |= cpuidHypervisor
		}
	}
	return entries
}

// withTSCDeadline returns entries with the TSC-deadline bit set in leaf 1.
func withTSCDeadline(entries []kvm.CPUIDEntry2) []kvm.CPUIDEntry2 {
	for i := range entries {
		if entries[i].Function == 1 {
			entries[i].ECX |= cpuidTSCDeadline
		}
	}
	return entries
}
