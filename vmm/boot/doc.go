// Package boot prepares a guest's memory and first vCPU state: it loads
// tern's ELF64 test guests and Linux bzImages into vmm/memory, builds
// identity-mapped long-mode page tables and a GDT in guest memory, and
// returns the initial register and segment state as plain data (CPUState)
// for a vCPU to apply. Its segments and descriptor tables are vmm/kvm's
// ABI types (kvm.Segment, kvm.DTable): the one thing boot takes from
// vmm/kvm, no ioctl.
//
// Invariants:
//   - Parsing is separate from loading: ParseELF and ParseBzImage read only
//     the bytes given, never touch guest memory, return typed errors, and
//     never panic on any input (fuzzed).
//   - Loading writes only inside guest RAM; a segment, table or image that
//     does not fit is an error (ErrOutsideRAM), never a partial write past
//     a region.
//   - Guests start directly in 64-bit mode (as Firecracker starts them):
//     under nested PVM, code that runs before paging is emulated one
//     instruction at a time, so tern never runs a guest's 32-bit entry. The
//     PVH note's 32-bit entry is parsed and reported only so that the same
//     file can be checked to run under QEMU.
//   - The identity page tables set U/S at every level: tern's test guests
//     load their own GDT, TSS and IDT and run their work at CPL3, the only
//     privilege level nested PVM runs natively.
//
// Fixed guest-physical layout below 1 MiB: GDT at GDTAddr, page tables
// from PageTablesAddr, Linux boot_params (the zero page) at ZeroPageAddr,
// the Linux command line at CmdlineAddr, the initial stack in
// the page below StackTopAddr. 0x8000 holds tern's test-guest parameter block
// (vmm/guests) and is left alone. vmm writes a Linux guest's ACPI tables
// from 0xe0000 (vmm/acpi), in the e820 map's reserved hole, and records
// their RSDP with SetACPIRSDP.
//
// Package vmm applies CPUState with KVM_SET_SREGS / KVM_SET_REGS (after
// KVM_SET_CPUID2) and boots the test guests from LoadELF + LongModeState
// on KVM. Still to come: proving that a stock kernel reaches "Linux
// version" from LoadLinux. Here the state is table-tested against the
// architecture's rules.
package boot
