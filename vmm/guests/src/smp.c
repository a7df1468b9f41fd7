/*
 * smp: every CPU works, checks its own memory, takes its local APIC's
 * timer and sends IPIs to the others; the BSP starts the others itself and
 * reports.
 *
 * The BSP (CPU 0, main) enables its local APIC (xAPIC MMIO at
 * LAPIC_BASE, reachable from CPL3: every page is a user page), copies the
 * real-mode trampoline (smp_cpu.S) to AP_TRAMPOLINE_ADDR and starts each
 * application processor as firmware does: INIT, 10 ms, a start-up IPI
 * (SIPI) with vector AP_SIPI_VECTOR, 200 us, a second SIPI. With the
 * ap_hold parameter it holds that start until the host sets the ap_go
 * word: 1 holds before the INIT, 2 between the INIT and the SIPIs (so a
 * host can migrate the VM while its APs wait for INIT or for the SIPI).
 * Each AP comes up at CPL3 in ap_start on its own stacks and TSS.
 *
 * Every CPU then runs the same loop at CPL3 (cpu_loop):
 *   - work: step n writes n into slot n % SLOTS of the CPU's own region
 *     (the slots are spread over its pages, one word per page in turn)
 *     and keeps the region's sum. Every VERIFY_MS it checks every slot
 *     against the value only n determines and the sum against the
 *     region's: a page lost or stale after a migration fails the check.
 *   - its local APIC timer every TIMER_MS (vector VEC_TIMER), periodic on
 *     the even CPUs, in TSC-deadline mode re-armed by the handler on the
 *     odd ones (where the local APIC has it: lapic_setup); the handler
 *     counts it. Once all CPUs run the BSP prints "smp: timers periodic
 *     tsc-deadline ...", each CPU's mode.
 *   - every IPI_MS a fixed IPI (vector VEC_IPI + sender) to each started
 *     CPU whose previous IPI from this one has arrived: the sender counts
 *     what it sent before it writes the ICR, the receiver's handler what
 *     it took, by sender. So per pair at most one is in flight, and one
 *     that never arrives stops that pair's count for good.
 *
 * The BSP's first line says where the regions are, for a host that
 * checks the check by spoiling one: "smp: cpu0 up, 4 cpus, regions at
 * 0x127000 of 262144 bytes" (CPU k's at the address + k * the size).
 *
 * Every PASS_MS the BSP reads every CPU's counters (the IPIs taken before
 * the IPIs sent) and prints one line:
 *
 *	smp: pass 12 aps started cpu0 up 2000 work 81920000 sweeps 40 timer 200 ipi-in 300 ipi-out 300 cpu1 ...
 *
 * (up: the milliseconds since the CPU started, by the TSC; a CPU not
 * started yet: "cpu2 waiting"; aps is held, init-sent, starting or
 * started). It fails, with "smp: FAIL ..." and exit status 1,
 * when a CPU found its memory wrong, a started CPU's work or timer count
 * did not grow for STALL_PASSES passes, a CPU took more IPIs from another
 * than that one sent, an IPI stayed in flight for STALL_PASSES passes
 * (lost), or an AP did not start within AP_START_MS of its SIPIs.
 * Exceptions end the guest through trap.c as in every guest.
 */
#include "guest.h"
#include "smp.h"

#define PAGE_WORDS 512
#define REGION_PAGES 64
#define SLOTS (REGION_PAGES * PAGE_WORDS)
#define BATCH 4096		/* work steps between looks at the clock */
#define TIMER_MS 10
#define TIMER_COUNT_PER_MS 62500	/* a 1 GHz APIC bus divided by 16 */
#define IPI_MS 10
#define VERIFY_MS 50
#define PASS_MS 250
#define STALL_PASSES 20
#define AP_START_MS 20000

/* Failure kinds a CPU records for the BSP to report. */
#define FAIL_SLOT 1		/* a slot of the region held the wrong value */
#define FAIL_SUM 2		/* the region's sum is not the kept one */

struct cpu {
	u8 user_stack[CPU_USER_STACK];
	u8 df_stack[CPU_DF_STACK];
	u8 kernel_stack[CPU_KERNEL_STACK];
	/* At rsp0, written by this CPU's interrupt handlers (smp_cpu.S). */
	volatile u64 timer;
	volatile u64 ipi_in[SMP_MAX_CPUS];
	/* The timer's handler's: see lapic_setup and smp_cpu.S. */
	volatile u64 deadline_ticks, deadline_next;
	/* CPUID leaf 1's ECX, read at CPL0 (an AP's only: smp_cpu.S). */
	u32 cpuid1_ecx;
	/* Written by this CPU at CPL3. */
	volatile u64 started, started_tsc;
	volatile u64 work;
	volatile u64 sweeps;
	volatile u64 ipi_out[SMP_MAX_CPUS];
	u64 sum;
	const char *timer_mode;	/* "periodic" or "tsc-deadline" */
	volatile u64 fail, fail_slot, fail_want, fail_found;
} __attribute__((aligned(4096)));

_Static_assert(sizeof(struct cpu) == CPU_SIZE, "struct cpu is CPU_SIZE bytes");
_Static_assert(__builtin_offsetof(struct cpu, timer) == CPU_RSP0 + IRQ_TIMER, "timer at rsp0");
_Static_assert(__builtin_offsetof(struct cpu, ipi_in) == CPU_RSP0 + IRQ_IPI, "ipi_in after it");
_Static_assert(__builtin_offsetof(struct cpu, deadline_ticks) == CPU_RSP0 + IRQ_DEADLINE, "then deadline_ticks");
_Static_assert(__builtin_offsetof(struct cpu, deadline_next) == CPU_RSP0 + IRQ_DEADLINE_NEXT, "and deadline_next");
_Static_assert(__builtin_offsetof(struct cpu, cpuid1_ecx) == CPU_RSP0 + CPU_CPUID1_ECX, "and cpuid1_ecx");

/* cpus is named by entry.S's TSSs and smp_cpu.S. */
struct cpu cpus[SMP_MAX_CPUS];
static u64 regions[SMP_MAX_CPUS][SLOTS] __attribute__((aligned(4096)));

extern const u8 ap_trampoline[], ap_trampoline_end[];
void ap_start(u64 id) __attribute__((noreturn));

static u64 ncpus, ms_ticks;

static void lapic_write(u32 reg, u32 v) { mmio_write32(LAPIC_BASE + reg, v); }
static u32 lapic_read(u32 reg) { return mmio_read32(LAPIC_BASE + reg); }

#define ICR_FIXED 0x4000	/* delivery mode fixed, level assert */
#define ICR_INIT 0x4500
#define ICR_SIPI 0x4600

static void send_ipi(u64 dest, u32 icr)
{
	lapic_write(LAPIC_ICR_HI, (u32)dest << 24);
	lapic_write(LAPIC_ICR_LO, icr);
}


#define LVT_PERIODIC (1 << 17)
#define LVT_TSC_DEADLINE (2 << 17)
#define LVT_MODE (3 << 17)

#define CPUID1_TSC_DEADLINE (1u << 24)

/*
 * lapic_setup enables CPU id's local APIC and its timer, every TIMER_MS:
 * on an odd CPU in TSC-deadline mode (one-shot, re-armed by the handler
 * through IA32_TSC_DEADLINE) where its CPUID says the local APIC has it
 * and the mode reads back as written, otherwise periodic (TMICT). KVM
 * keeps the mode field at one-shot for a vCPU whose CPUID lacks the bit;
 * QEMU's own local APIC (TCG) keeps what is written and never fires.
 */
static void lapic_setup(u64 id)
{
	lapic_write(LAPIC_SVR, 0x100 | VEC_SPURIOUS);
	lapic_write(LAPIC_LVT_LINT0, 1 << 16);	/* masked: no PIC */
	lapic_write(LAPIC_LVT_LINT1, 1 << 16);
	lapic_write(LAPIC_LVT_ERROR, 1 << 16);
	if (id & 1 && cpus[id].cpuid1_ecx & CPUID1_TSC_DEADLINE) {
		lapic_write(LAPIC_LVT_TIMER, LVT_TSC_DEADLINE | VEC_TIMER);
		if ((lapic_read(LAPIC_LVT_TIMER) & LVT_MODE) == LVT_TSC_DEADLINE) {
			/*
			 * The handler re-arms it at each interrupt; the
			 * first is a self-IPI on the timer's vector (CPL3
			 * writes no MSR), which counts as a tick.
			 */
			cpus[id].deadline_ticks = TIMER_MS * ms_ticks;
			cpus[id].timer_mode = "tsc-deadline";
			send_ipi(id, ICR_FIXED | VEC_TIMER);
			return;
		}
	}
	lapic_write(LAPIC_TDCR, 0x3);		/* divide by 16 */
	lapic_write(LAPIC_LVT_TIMER, LVT_PERIODIC | VEC_TIMER);
	lapic_write(LAPIC_TMICT, TIMER_MS * TIMER_COUNT_PER_MS);
	cpus[id].timer_mode = "periodic";
}

static u64 *slot_word(u64 *region, u64 slot)
{
	return &region[slot % REGION_PAGES * PAGE_WORDS + slot / REGION_PAGES];
}

static void work(struct cpu *c, u64 *region)
{
	u64 n = c->work, sum = c->sum;
	for (int i = 0; i < BATCH; i++) {
		u64 *w = slot_word(region, ++n % SLOTS);
		sum += n - *w;
		*w = n;
	}
	c->sum = sum;
	c->work = n;
}

/* verify checks every slot and the sum; on a mismatch it records it. */
static int verify(struct cpu *c, u64 *region)
{
	u64 n = c->work, total = 0;
	for (u64 slot = 0; slot < SLOTS; slot++) {
		u64 want = n >= slot ? n - (n - slot) % SLOTS : 0;
		u64 got = *slot_word(region, slot);
		if (got != want) {
			c->fail_slot = slot, c->fail_want = want, c->fail_found = got;
			c->fail = FAIL_SLOT;
			return 0;
		}
		total += got;
	}
	if (total != c->sum) {
		c->fail_want = c->sum, c->fail_found = total;
		c->fail = FAIL_SUM;
		return 0;
	}
	c->sweeps++;
	return 1;
}

static void send_ipis(u64 me)
{
	for (u64 t = 0; t < ncpus; t++) {
		if (t == me || !cpus[t].started || cpus[t].ipi_in[me] != cpus[me].ipi_out[t])
			continue;
		cpus[me].ipi_out[t]++;
		send_ipi(t, ICR_FIXED | (VEC_IPI + (u32)me));
	}
}

/* The BSP's state: the APs' start and the passes. */
enum { APS_HELD, APS_INIT_SENT, APS_SIPI_SENT, APS_STARTING, APS_STARTED };
static const char *const aps_names[] = { "held", "init-sent", "starting", "starting", "started" };
static int aps;
static u64 aps_at, pass, next_pass;
static u64 last_work[SMP_MAX_CPUS], last_timer[SMP_MAX_CPUS];
static u64 still_work[SMP_MAX_CPUS], still_timer[SMP_MAX_CPUS];
static u64 last_out[SMP_MAX_CPUS][SMP_MAX_CPUS], stuck[SMP_MAX_CPUS][SMP_MAX_CPUS];

static __attribute__((noreturn)) void fail_cpu(u64 k, const char *what, u64 v)
{
	puts("smp: FAIL cpu ");
	putdec(k);
	puts(what);
	putdec(v);
	puts("\n");
	exit(1);
}

static void sipi_all(void)
{
	for (u64 k = 1; k < ncpus; k++)
		send_ipi(k, ICR_SIPI | AP_SIPI_VECTOR);
}

/* start_aps moves the APs' start on, as far as time and the hold let it. */
static void start_aps(u64 now)
{
	u64 hold = param(P_AP_HOLD, 0);
	int go = *(volatile u64 *)(PARAMS_ADDR + P_AP_GO) != 0;
	switch (aps) {
	case APS_HELD:
		if (hold == 1 && !go)
			return;
		for (u64 k = 1; k < ncpus; k++)
			send_ipi(k, ICR_INIT);
		puts("smp: INIT sent\n");
		aps = APS_INIT_SENT;
		aps_at = now;
		return;
	case APS_INIT_SENT:
		if (now - aps_at < 10 * ms_ticks || (hold == 2 && !go))
			return;
		sipi_all();
		puts("smp: SIPI sent\n");
		aps = APS_SIPI_SENT;
		aps_at = rdtsc();
		return;
	case APS_SIPI_SENT:
		if (now - aps_at < ms_ticks / 5)
			return;
		sipi_all();
		aps = APS_STARTING;
		return;
	case APS_STARTING:
		for (u64 k = 1; k < ncpus; k++) {
			if (cpus[k].started)
				continue;
			if (now - aps_at > AP_START_MS * ms_ticks)
				fail_cpu(k, " did not start; ms ", AP_START_MS);
			return;
		}
		puts("smp: all ");
		putdec(ncpus);
		puts(" cpus started\nsmp: timers");
		for (u64 k = 0; k < ncpus; k++) {
			puts(" ");
			puts(cpus[k].timer_mode);
		}
		puts("\n");
		aps = APS_STARTED;
		return;
	}
}

/* check_stall counts the passes v stood still; too many fail. */
static void check_stall(u64 k, u64 v, u64 *last, u64 *still, const char *what)
{
	if (v != *last) {
		*last = v;
		*still = 0;
		return;
	}
	if (++*still >= STALL_PASSES)
		fail_cpu(k, what, v);
}

static void report_pass(void)
{
	u64 in[SMP_MAX_CPUS][SMP_MAX_CPUS], out[SMP_MAX_CPUS][SMP_MAX_CPUS];
	int up[SMP_MAX_CPUS];
	/* Received before sent: what was read as taken was sent before. */
	for (u64 k = 0; k < ncpus; k++) {
		up[k] = cpus[k].started != 0;
		for (u64 s = 0; s < ncpus; s++)
			in[k][s] = cpus[k].ipi_in[s];
	}
	for (u64 k = 0; k < ncpus; k++)
		for (u64 t = 0; t < ncpus; t++)
			out[k][t] = cpus[k].ipi_out[t];
	pass++;
	puts("smp: pass ");
	putdec(pass);
	puts(" aps ");
	puts(aps_names[aps]);
	for (u64 k = 0; k < ncpus; k++) {
		puts(" cpu");
		putdec(k);
		if (!up[k]) {
			puts(" waiting");
			continue;
		}
		u64 sin = 0, sout = 0;
		for (u64 o = 0; o < ncpus; o++)
			sin += in[k][o], sout += out[k][o];
		puts(" up ");
		putdec((rdtsc() - cpus[k].started_tsc) / ms_ticks);
		puts(" work ");
		putdec(cpus[k].work);
		puts(" sweeps ");
		putdec(cpus[k].sweeps);
		puts(" timer ");
		putdec(cpus[k].timer);
		puts(" ipi-in ");
		putdec(sin);
		puts(" ipi-out ");
		putdec(sout);
	}
	puts("\n");
	for (u64 k = 0; k < ncpus; k++) {
		struct cpu *c = &cpus[k];
		if (c->fail == FAIL_SLOT) {
			puts("smp: FAIL cpu ");
			putdec(k);
			puts(" memory: slot ");
			putdec(c->fail_slot);
			puts(" want ");
			putdec(c->fail_want);
			puts(" found ");
			putdec(c->fail_found);
			puts("\n");
			exit(1);
		}
		if (c->fail == FAIL_SUM) {
			puts("smp: FAIL cpu ");
			putdec(k);
			puts(" memory: sum want ");
			putdec(c->fail_want);
			puts(" found ");
			putdec(c->fail_found);
			puts("\n");
			exit(1);
		}
		if (!up[k])
			continue;
		check_stall(k, c->work, &last_work[k], &still_work[k], " stopped working at ");
		check_stall(k, c->timer, &last_timer[k], &still_timer[k], " timer stopped at ");
		for (u64 t = 0; t < ncpus; t++) {
			if (t == k || !up[t])
				continue;
			/* in[t][k] was read before out[k][t]: never more. */
			if (in[t][k] > out[k][t]) {
				puts("smp: FAIL cpu ");
				putdec(t);
				puts(" took ");
				putdec(in[t][k]);
				puts(" IPIs from cpu ");
				putdec(k);
				puts(", which sent ");
				putdec(out[k][t]);
				puts("\n");
				exit(1);
			}
			if (in[t][k] == out[k][t] || out[k][t] != last_out[k][t]) {
				last_out[k][t] = out[k][t];
				stuck[k][t] = 0;
				continue;
			}
			if (++stuck[k][t] >= STALL_PASSES) {
				puts("smp: FAIL IPI from cpu ");
				putdec(k);
				puts(" to cpu ");
				putdec(t);
				puts(" lost: sent ");
				putdec(out[k][t]);
				puts(", taken ");
				putdec(in[t][k]);
				puts("\n");
				exit(1);
			}
		}
	}
}

static __attribute__((noreturn)) void cpu_loop(u64 me)
{
	struct cpu *c = &cpus[me];
	u64 *region = regions[me];
	u64 now = rdtsc(), next_ipi = now, next_verify = now + VERIFY_MS * ms_ticks;
	for (;;) {
		work(c, region);
		now = rdtsc();
		if (now >= next_ipi) {
			send_ipis(me);
			next_ipi = now + IPI_MS * ms_ticks;
		}
		if (now >= next_verify) {
			if (!verify(c, region)) {
				if (me == 0)
					report_pass();	/* reports it and exits */
				for (;;)	/* the BSP reports it */
					;
			}
			next_verify = rdtsc() + VERIFY_MS * ms_ticks;
		}
		if (me != 0)
			continue;
		if (aps != APS_STARTED)
			start_aps(now);
		if (now >= next_pass) {
			report_pass();
			next_pass = rdtsc() + PASS_MS * ms_ticks;
		}
	}
}

void ap_start(u64 id)
{
	lapic_setup(id);
	cpus[id].started_tsc = rdtsc();
	cpus[id].started = 1;
	cpu_loop(id);
}

int main(void)
{
	ncpus = param(P_VCPUS, 1);
	ms_ticks = tsc_khz();
	if (ncpus > SMP_MAX_CPUS) {
		puts("smp: FAIL ");
		putdec(ncpus);
		puts(" vcpus, at most " );
		putdec(SMP_MAX_CPUS);
		puts("\n");
		return 1;
	}
	puts("smp: cpu0 up, ");
	putdec(ncpus);
	puts(" cpus, regions at ");
	puthex((uptr)regions);
	puts(" of ");
	putdec(sizeof regions[0]);
	puts(" bytes\n");
	memcpy((void *)AP_TRAMPOLINE_ADDR, ap_trampoline, (unsigned long)(ap_trampoline_end - ap_trampoline));
	lapic_setup(0);
	cpus[0].started_tsc = rdtsc();
	cpus[0].started = 1;
	aps = ncpus > 1 ? APS_HELD : APS_STARTED;
	next_pass = rdtsc() + PASS_MS * ms_ticks;
	cpu_loop(0);
}
