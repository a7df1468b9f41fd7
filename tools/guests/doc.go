// Package guests embeds tern's freestanding x86-64 test guests, compiled
// from the C and assembly in src/ by `go generate ./tools/guests` (which
// runs ./internal/gen with the machine's cc) and committed under elf/, so
// that building tern needs no C compiler.
//
// Every guest is one ELF64 file linked at 1 MiB (virtual == physical) that
// runs two ways:
//
//   - The ELF entry point is a 64-bit entry: tern starts the guest already
//     in long mode, on identity page tables it built itself covering at
//     least the first 4 GiB, and no other state (the guest sets its own
//     stack and clears its .bss).
//   - A PVH ELF note (XEN_ELFNOTE_PHYS32_ENTRY, in a PT_NOTE segment) names a
//     32-bit entry that builds those page tables and enters long mode; QEMU
//     uses it with `-M microvm -kernel FILE`.
//
// The guests talk to the host through the 8250 UART at port 0x3f8, the
// boot-timer byte at guest-physical 0xC0000000 (magic 123), and the exit
// port 0xf4: a guest writes its status there, 0 for success (QEMU's
// isa-debug-exit then exits with (status<<1)|1). They are built with
// -mgeneral-regs-only: no x87/SSE state is touched.
//
// Optional parameters come from a parameter block the host writes at
// guest-physical 0x8000 before start (layout in src/guest.h and
// [Params]); without it each guest uses its defaults.
//
//   - hello prints "Hello from the tern test guest", writes 123 to the boot
//     timer and exits 0.
//   - dirty fills memory with a pattern derived from (page, generation,
//     word), rewrites a working set each pass, verifies every page, and
//     prints the longest TSC gap in its own progress (the guest-visible
//     downtime of a migration). See src/dirty.c.
//   - disk drives the first virtio-mmio virtio-blk device (modern, virtio
//     1.x): it writes a seeded pattern, flushes, reads back, verifies and
//     prints "disk: PASS N sectors" or "disk: FAIL sector N". See
//     src/disk.c and [DiskPattern].
//
// The ELF bytes are reproducible for one compiler version: elf/COMPILER
// records it, and the test that rebuilds and compares skips when the local
// cc differs. Under KVM the guests are untested until vmm's vCPU loop
// exists; today they are proven under QEMU TCG (qemu_test.go).
package guests
