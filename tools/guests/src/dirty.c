/*
 * dirty: the migration correctness oracle.
 *
 * It fills [mem_start, mem_start+mem_bytes) with a pattern derived from
 * (page index, generation, word index), then keeps rewriting the first
 * working_set_bytes of it, one generation per pass, waiting page_delay_tsc
 * TSC ticks per page to set the dirtying rate. Every page carries its own
 * index and generation in its first two words, so a stale or torn page is
 * detected by verify(), which checks every word of every page against the
 * generation it must hold.
 *
 * Parameters come from the parameter block (guest.h); defaults: 16 MiB at
 * 4 MiB, a 1 MiB working set, 16 passes, no delay. passes = ~0 runs
 * forever; then the host asks for a verification by changing the u64 at
 * PARAMS_ADDR+0x58 and the guest, after its current pass, verifies, prints
 * the result and copies that value to PARAMS_ADDR+0x60.
 *
 * It measures with the TSC the longest gap between two consecutive page
 * writes (the guest-visible downtime of a migration) and prints it as
 * "dirty: max progress gap N tsc ticks". Exit status 0 when every
 * verification passed, 1 otherwise.
 */
#include "guest.h"

#define PAGE 4096UL
#define WORDS (PAGE / 8)
#define PAGE_TAG 0x7465726e64697274ULL
#define VERIFY_REQUEST (PARAMS_ADDR + 0x58)
#define VERIFY_ACK (PARAMS_ADDR + 0x60)

static u64 mix(u64 page, u64 gen, u64 w)
{
	u64 x = page * 0x9e3779b97f4a7c15ULL ^ gen * 0xbf58476d1ce4e5b9ULL ^ w;
	x ^= x >> 31;
	x *= 0x94d049bb133111ebULL;
	x ^= x >> 29;
	return x;
}

static void write_page(u64 *p, u64 page, u64 gen)
{
	p[0] = page ^ PAGE_TAG;
	p[1] = gen;
	for (u64 w = 2; w < WORDS; w++)
		p[w] = mix(page, gen, w);
}

static u64 max_gap, last_tsc;

static void progress(void)
{
	u64 now = rdtsc();
	if (last_tsc && now - last_tsc > max_gap)
		max_gap = now - last_tsc;
	last_tsc = now;
}

/* verify returns 0 when every page holds its expected generation. */
static int verify(u64 *base, u64 pages, u64 ws_pages, u64 gen)
{
	for (u64 i = 0; i < pages; i++) {
		u64 *p = base + i * WORDS;
		u64 want = i < ws_pages ? gen : 0;
		int ok = p[0] == (i ^ PAGE_TAG) && p[1] == want;
		for (u64 w = 2; ok && w < WORDS; w++)
			ok = p[w] == mix(i, want, w);
		if (!ok) {
			puts("dirty: verify FAIL page ");
			putdec(i);
			puts(" want generation ");
			putdec(want);
			puts(" found ");
			putdec(p[1]);
			puts("\n");
			return 1;
		}
	}
	puts("dirty: verify PASS generation ");
	putdec(gen);
	puts("\n");
	return 0;
}

int main(void)
{
	u64 start = param(0x10, 4UL << 20);
	u64 bytes = param(0x18, 16UL << 20);
	u64 ws = param(0x20, 1UL << 20);
	u64 passes = param(0x28, 16);
	u64 delay = param(0x30, 0);
	u64 *base = (u64 *)(uptr)start;
	u64 pages = bytes / PAGE;
	u64 ws_pages = ws / PAGE < pages ? ws / PAGE : pages;
	int failed = 0;

	puts("dirty: ");
	putdec(pages);
	puts(" pages at ");
	puthex(start);
	puts(", working set ");
	putdec(ws_pages);
	puts(" pages\n");

	for (u64 i = 0; i < pages; i++) {
		write_page(base + i * WORDS, i, 0);
		progress();
	}
	u64 seen_request = *(volatile u64 *)VERIFY_REQUEST;
	u64 gen = 0;
	while (passes == ~0ULL || gen < passes) {
		gen++;
		for (u64 i = 0; i < ws_pages; i++) {
			write_page(base + i * WORDS, i, gen);
			progress();
			for (u64 t0 = rdtsc(); delay && rdtsc() - t0 < delay;)
				;
		}
		u64 req = *(volatile u64 *)VERIFY_REQUEST;
		if (passes == ~0ULL && req != seen_request) {
			seen_request = req;
			failed |= verify(base, pages, ws_pages, gen);
			*(volatile u64 *)VERIFY_ACK = req;
			last_tsc = 0;	/* verification is not a progress gap */
		}
	}
	failed |= verify(base, pages, ws_pages, gen);
	puts("dirty: max progress gap ");
	putdec(max_gap);
	puts(" tsc ticks\n");
	return failed;
}
