// Package guests embeds tern's freestanding x86-64 test guests, compiled
// from the C and assembly in src/ by `go generate ./vmm/guests` (which
// runs ./internal/gen with the machine's cc) and committed under elf/, so
// that building tern needs no C compiler.
//
// Every guest is one ELF64 file linked at 1 MiB (virtual == physical) that
// runs two ways:
//
//   - The ELF entry point is a 64-bit entry: tern starts the guest already
//     in long mode, on identity page tables it built itself covering at
//     least the first 4 GiB with U/S set at every level (vmm/boot), and no
//     other state.
//   - A PVH ELF note (XEN_ELFNOTE_PHYS32_ENTRY, in a PT_NOTE segment) names a
//     32-bit entry that loads the guest's own static copy of those page
//     tables and enters long mode; QEMU uses it with `-M microvm -kernel
//     FILE`.
//
// # CPL0 set-up, CPL3 work
//
// Under nested PVM a guest's CPL0 code is emulated one instruction at a
// time (about 0.7 M instructions/s) while CPL3 code runs natively, so
// every guest does its work in user mode. Both entries reach the same
// short CPL0 path (src/entry.S): it loads a static GDT (kernel code 0x08
// and data 0x10, user data 0x1b, 64-bit user code 0x23, a 64-bit TSS at
// 0x28), a static IDT and the TSS, then enters CPL3 with iretq. Nothing is
// computed at CPL0: every descriptor, gate and page-table entry is
// complete at link time, so the PVH path runs 13 instructions and
// tern's 64-bit entry 12 (under nested PVM the vCPU's insn_emulation
// counter reads 12 at the guest's first exit, its first UART write from
// CPL3; after that it counts one per port access). The C start-up
// (clearing .bss, initialising the UART) and main() run at CPL3; IF stays
// clear, IOPL 0.
//
// The TSS's IO-permission bitmap allows the UART's ports 0x3f8-0x3ff and
// the exit port 0xf4 and nothing else: any other port raises #GP at CPL3.
// MMIO (the boot timer, virtio-mmio) needs nothing: every page is a user
// page. The IDT handles vectors 0-31 at CPL0 (rsp0 from the TSS, #DF on
// its own IST stack): the handler prints
//
//	guest: exception #PF vector 14 error 0x4 rip 0x100956 cpl 3 cr2 0x100000000
//
// (CR2 only for #PF) and exits with status 0x40 + vector
// ([ExceptionStatus]). A guest's exit is a write of its status to port
// 0xf4; if that does not end the VM, the guest's next instruction, hlt,
// faults into the handler, which halts at CPL0.
//
// # The host interface
//
// The guests talk to the host through the 8250 UART at port 0x3f8 (output
// polls LSR.THRE; input polls LSR bit 0 at 0x3fd and reads 0x3f8), the
// boot-timer byte at guest-physical 0xC0000000 (magic 123), and the exit
// port 0xf4: a guest writes its status there, 0 for success (QEMU's
// isa-debug-exit then exits with (status<<1)|1). They are built with
// -mgeneral-regs-only: no x87/SSE state is touched. They take no
// interrupts, but smp.
//
// Optional parameters come from a parameter block the host writes at
// guest-physical 0x8000 before start (layout in src/guest.h and
// [Params]); without it each guest uses its defaults, and a zero field
// means the default. tsc_khz is the TSC frequency the guests scale their
// printed times and rates by; the host knows it (KVM_GET_TSC_KHZ) and
// should fill it in, otherwise [DefaultTSCkHz] is assumed.
//
// # The guests
//
//   - hello writes 123 to the boot timer (the guest program has started),
//     prints "Hello from the tern test guest" and exits 0. With hello_fault it then raises an exception on
//     purpose ([HelloFaultPage] and friends), to prove the handler.
//   - dirty fills memory with a pattern derived from (page, generation,
//     word), rewrites a working set each pass, and verifies every page at
//     the end, every verify_every_sec seconds of dirtying (default 1) and
//     whenever the host asks through the verify-request word. It prints
//     "dirty: rate N MiB/s" (distinct pages dirtied per second, since the
//     last), "dirty: verify PASS generation N" or "dirty: verify FAIL page
//     P want generation G found H", "dirty: verified N MiB in M ms", and at
//     the end of a bounded run the longest TSC gap in its own progress
//     (the guest-visible downtime of a migration). passes = ~0
//     ([PassesForever]) runs until the VM is stopped and prints
//     "dirty: progress gap N us" for every gap over 1 ms as it happens,
//     and before each verification "dirty: largest gap N us", the
//     longest since the previous one however short; its gap clock ticks
//     through its own printing, so a stall while it prints is a gap too.
//     With idle ([Params.Idle]; the API's idle param) it fills once and
//     then dirties nothing, printing "dirty: idle, dirtying nothing": it
//     still watches the clock (so it reports its gaps), verifies
//     generation 0 every verify_every_sec (after "dirty: rate 0 MiB/s")
//     and on request; a bounded run ends after passes such intervals.
//     [ParseDirtyRate], [ParseDirtyVerify], [ParseDirtyGap] and
//     [ParseDirtyLargestGap] read those
//     lines for a host. See src/dirty.c.
//   - disk drives the first virtio-mmio virtio-blk device (modern, virtio
//     1.x) from CPL3: it writes a seeded pattern, flushes, reads back,
//     verifies and prints "disk: PASS N sectors" or "disk: FAIL sector N".
//     With Passes other than 1 it repeats, pass K writing the pattern of
//     seed + K and printing "disk: PASS N sectors pass K" (what a live
//     migration in the middle of a pass must not break). See src/disk.c
//     and [DiskPattern].
//   - echo prints "echo: ready", then echoes every line it reads from the
//     UART as "echo: <line>" (CR, LF or CR LF ends a line; lines over 128
//     bytes come back in pieces); the line "quit" makes it print
//     "echo: bye" and exit 0. See src/echo.c.
//   - demo stays running, as a demonstration VM does. It finds the disk as
//     disk does and prints "demo: disk id <id>" and "demo: ready, disk N
//     sectors" (or "demo: no disk", once, and "demo: ready, no disk").
//     Once a second by the TSC, round R (from 1) writes `sectors` sectors
//     (default 4, at most 8) from [DemoRoundFirstSector] with
//     [DemoPattern], flushes, reads back, verifies and prints "demo: round
//     R wrote W sectors, verified V, ok" or "demo: round R FAIL sector S"
//     (or "FAIL write request" and the like) and carries on; without a
//     disk "demo: round R no disk". A round due late (a paused VM) runs
//     once: missed rounds are skipped. Between rounds it echoes each line
//     as "demo: echo <line>", like echo; "quit" makes it print "demo: bye"
//     and exit 0. [ParseDemoReady], [ParseDemoRound] and [ParseDemoEcho]
//     read those lines. See src/demo.c.
//   - smp runs on 1 to [SMPMaxCPUs] vCPUs (Params.VCPUs, which tern fills
//     in) with their local APICs: its ELF note (name "tern", type 1,
//     vmm/boot.TernNoteLocalAPICs) makes tern create the in-kernel
//     irqchip and leave the application processors in KVM's reset
//     state. The BSP starts each AP as firmware does, INIT, 10 ms, a
//     start-up IPI (vector 0x70), 200 us, a second one; an AP starts in
//     real mode in the trampoline the BSP copied to 0x70000, loads the
//     image's GDT, enters protected mode, loads the PVH path's page
//     tables, enters long mode, loads the IDT and its own TSS (selector
//     0x28 + 16 * its APIC ID) and drops to CPL3 with IF set on its own
//     stacks (src/smp_cpu.S: about 45 instructions at CPL0 per AP, a
//     CPUID among them: at CPL3 nested PVM answers with the host's). With
//     ap_hold ([Params.APHold]) the BSP holds before the INIT or before
//     the SIPIs until the host sets the word at [APGoOffset], so a VM can
//     be migrated while its APs wait. Every CPU then loops at CPL3:
//     writes a counter into its own 256 KiB region (one word per page in
//     turn) and verifies the whole region every 50 ms against what the
//     counter alone determines; takes its LAPIC timer every 10 ms
//     (periodic on the even CPUs, TSC-deadline re-armed on schedule by the
//     handler on the odd ones where their CPUID offers it: tern does where
//     KVM has it, QEMU's default CPU does not); and every 10 ms
//     sends each started CPU a fixed IPI (vector 0x50 + sender) when that
//     CPU took its previous one, so at most one per pair is in flight.
//     The interrupt handlers (CPL0, 6 to 20 instructions) count, by
//     sender for IPIs, in the CPU's block at its TSS's rsp0, and EOI.
//     The BSP prints "smp: cpu0 up, N cpus, regions at ADDR of SIZE
//     bytes", "smp: INIT sent", "smp: SIPI sent", "smp: all N cpus
//     started", "smp: timers periodic tsc-deadline ..." and every 250 ms
//     a pass, "smp: pass P aps started cpu0 up MS work W sweeps S timer T
//     ipi-in I ipi-out O cpu1 ..." ("cpuK waiting" before it starts). It
//     fails, with "smp: FAIL ..." and exit status 1, on a region found
//     wrong, a started CPU's work or timer standing still for
//     [SMPStallPasses] passes, more IPIs taken from a CPU than it sent,
//     an IPI in flight for [SMPStallPasses] passes (lost), or an AP not
//     started 20 s after its SIPIs. [ParseSMPPass], [CheckSMPProgress],
//     [CheckSMPTimerRate], [ParseSMPStart] and [ParseSMPTimers] read its
//     lines for a host. See src/smp.c.
//
// disk and demo share the virtio-blk driver (src/virtio_blk.c: one
// 8-entry split virtqueue, one request at a time, the used ring polled, no
// interrupts), echo and demo the UART line reader (src/line.c: between
// polls of an empty UART it waits 50 µs on the TSC, not an exit per
// spin). The build links a shared source only into the guests that use
// it. smp assembles src/smp_entry.S instead of entry.S: entry.S with
// SMP_GUEST defined, which adds the APs' TSSs, a 32-bit code segment, the
// interrupt gates and src/smp_cpu.S, and sets the BSP's rsp0 and IF; the
// other guests assemble to the same bytes as without it.
//
// Under QEMU with KVM on a nested-PVM machine, dirty fills 256 MiB in
// about 0.6 s (first touch of each page dominates), rewrites its working
// set at about 10 GiB/s and verifies 256 MiB in 10-90 ms, with about 520
// emulated instructions in all; the same loops at CPL0 managed under
// 1 MiB/s (4 M emulated instructions for 1 MiB).
//
// The ELF bytes are reproducible for one compiler version: elf/COMPILER
// records it, and the test that rebuilds and compares skips when the local
// cc differs. The guests are proven under QEMU TCG (qemu_test.go), and
// under QEMU with KVM where /dev/kvm is usable (those tests skip
// otherwise); tern's own KVM tests come with the VMM.
package guests
