// Package vmm assembles and runs a virtual machine on KVM: guest RAM
// (vmm/memory), a guest loaded by vmm/boot and entered directly in 64-bit
// mode on page tables tern builds, the devices of vmm/devices on port-IO
// and MMIO buses, and one vmm/vcpu goroutine per vCPU.
//
//	vm, err := vmm.New(cfg)   // validates everything, builds; vCPUs parked
//	status, err := vm.Run(ctx) // until the guest writes port 0xf4, or an end
//	vm.Close()                 // frees every fd, mapping and goroutine
//
// Invariants:
//   - New validates the whole Config before it creates anything and
//     reports every problem at once (errors.Join; each wraps
//     ErrInvalidConfig); it builds under a deferred cleanup, so a failed
//     New leaves nothing open.
//   - A VM owns everything it opened: the /dev/kvm and VM fds, every vCPU
//     fd and kvm_run mapping, the guest RAM memfds and mappings, and the
//     vCPU goroutines. Close stops and waits for the goroutines first, then
//     closes the vCPUs and VM, then unmaps RAM. The disk backend is the
//     caller's and is not closed; so are the disk backends.
//   - Run ends with the status the guest wrote to the debug-exit port
//     0xf4 (err nil); with ErrPoweredOff or ErrGuestReset when a Linux
//     guest powers off or reboots through its ACPI registers
//     (devices.Power, named by the FADT); with ErrStopped after Stop; with
//     the context's error;
//     or with the error that ended a vCPU (vcpu.ErrShutdown for a triple
//     fault, vcpu.ErrInternal, vcpu.ErrHalted). It never returns while a
//     vCPU goroutine runs. The vCPU that writes port 0xf4 stops before it
//     executes another guest instruction.
//   - Devices: the 8250 UART on 0x3f8 (output into a bounded History,
//     input through UART.Input), debug exit on 0xf4, the boot timer at
//     0xC0000000 and, per disk, virtio-blk over virtio-mmio at
//     VirtioBlkAddr(i) (VirtioBlkBase for the first), served on the vCPU
//     thread straight from and into guest memory, FLUSH mapped to the
//     backend's Flush. tern's guests poll; no interrupt reaches them.
//   - Network cards (Config.NICs, nics.go): virtio-net on a TAP each, card
//     j in virtio-mmio slot NICSlot(j), its address given or NICMAC of
//     the TAP's name. The VM opens the TAPs in New and owns them; each
//     card receives on its own goroutine, which Pause holds (nothing is
//     written into guest memory while paused) and Close ends before
//     guest RAM is unmapped. A Linux guest's card interrupts and is
//     notified as its disks are (an irqfd on VirtioSlotGSI, ioeventfds,
//     queue workers); tern's udp guest polls its card (no interrupt).
//   - A Linux guest (Config.Linux) also gets KVM's in-kernel irqchip and
//     PIT, CPUID with the hypervisor and TSC-deadline bits, the UART's
//     interrupt on IRQ 4, and ACPI tables (vmm/acpi: its vCPUs, the
//     IOAPIC, COM1 and the occupied virtio-mmio slots) in the BIOS area
//     (linux_platform.go); its disks interrupt through an irqfd on their
//     slot's GSI and are notified through an ioeventfd per queue, each
//     queue served on its own goroutine, not the vCPU's (virtio_irq.go).
//   - A guest ELF with tern's local-APIC note (boot.ELFImage.LocalAPICs:
//     the smp guest) gets the in-kernel irqchip without a PIT, and CPUID
//     with the TSC-deadline bit where KVM has it; a migration target
//     built for it gets the same, from the same image.
//   - New starts one vmm/vcpu goroutine per vCPU, which creates its vCPU
//     on its own locked thread and parks before the first instruction;
//     Run lets them go. vCPU 0 starts at the guest's entry. For tern's
//     own uniprocessor guests, further vCPUs start at a HLT tern writes
//     at APParkAddr and wait there until Stop; with the irqchip (a Linux
//     guest, the smp guest) they stay in KVM's reset state until the
//     guest starts them with INIT and a start-up IPI.
//   - Built-in guests (vmm/guests) get a parameter block at
//     guests.ParamsAddr with the TSC frequency KVM reports, the vCPU
//     count and the virtio-mmio base filled in.
//   - Pause returns once every vCPU is parked at an instruction boundary;
//     then VCPUs()[i].KVM() and KVM() may be used to inspect or capture
//     state, until Resume.
//   - New and NewMigrationTarget are one builder (newVM); a migration
//     target is built on the memory it is given and skips only the boot
//     image (guest, boot vCPU state, application processors' HLT,
//     parameter block), every vCPU parked in KVM's reset state.
//   - A VM's state is a list of DeviceState entries (vm_state.go): the
//     vCPUs' (each with its local APIC, pending events and MP state), the
//     clock's, the irqchips' and a Linux guest's PIT's, which
//     the VM encodes, and each devices.Stateful device's, which the
//     device encodes. SaveState captures them from a paused VM;
//     RestoreState checks that they describe this VM before it loads
//     any, then loads clock, platform, vCPUs and devices in that order.
package vmm
