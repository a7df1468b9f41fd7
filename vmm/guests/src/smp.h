/*
 * smp.h: the layout the smp guest's CPL0 code (smp_cpu.S, assembled into
 * entry.S) and its C code (smp.c) share. Plain #defines only: the
 * assembler reads it too.
 *
 * Each CPU has one struct cpu (smp.c) of CPU_SIZE bytes in the array
 * cpus: its user stack, its #DF stack, its kernel stack, then, at the
 * kernel stack's top (the TSS's rsp0), the counters its interrupt
 * handlers increment. An interrupt arrives only at CPL3 (IF is clear at
 * CPL0), so a handler finds its CPU's counters at a fixed distance above
 * its own stack pointer: the CPU pushed five words on rsp0.
 */
#ifndef TERN_SMP_H
#define TERN_SMP_H

#define SMP_MAX_CPUS 4

#define CPU_USER_STACK 16384
#define CPU_DF_STACK 4096
#define CPU_KERNEL_STACK 4096
#define CPU_DF_STACK_TOP (CPU_USER_STACK + CPU_DF_STACK)
#define CPU_RSP0 (CPU_DF_STACK_TOP + CPU_KERNEL_STACK)
#define CPU_SIZE (CPU_RSP0 + 4096)

/*
 * Offsets from rsp0 of the counters the CPL0 handlers increment, and of
 * what the timer's handler reads.
 */
#define IRQ_TIMER 0		/* u64: LAPIC timer interrupts taken */
#define IRQ_IPI 8		/* u64[SMP_MAX_CPUS]: IPIs taken, by sender */
#define IRQ_DEADLINE 40		/* u64: a TSC-deadline timer's period in TSC ticks; 0 periodic */
#define IRQ_DEADLINE_NEXT 48	/* u64: the deadline the handler armed last */
#define CPU_CPUID1_ECX 56	/* u32: CPUID leaf 1's ECX, as an AP read it at CPL0 */

#define MSR_TSC_DEADLINE 0x6e0

/* Vectors: the LAPIC timer, one per IPI sender, the spurious vector. */
#define VEC_TIMER 0x40
#define VEC_IPI 0x50		/* + the sender's CPU number */
#define VEC_SPURIOUS 0xff

/* The application processors' start-up page: SIPI vector AP_SIPI_VECTOR. */
#define AP_SIPI_VECTOR 0x70
#define AP_TRAMPOLINE_ADDR (AP_SIPI_VECTOR << 12)

/* The local APIC's registers (xAPIC MMIO). */
#define LAPIC_BASE 0xfee00000
#define LAPIC_ID 0x20
#define LAPIC_EOI 0xb0
#define LAPIC_SVR 0xf0
#define LAPIC_ICR_LO 0x300
#define LAPIC_ICR_HI 0x310
#define LAPIC_LVT_TIMER 0x320
#define LAPIC_LVT_LINT0 0x350
#define LAPIC_LVT_LINT1 0x360
#define LAPIC_LVT_ERROR 0x370
#define LAPIC_TMICT 0x380
#define LAPIC_TMCCT 0x390
#define LAPIC_TDCR 0x3e0

#endif
