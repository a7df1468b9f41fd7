/*
 * dirty: the migration correctness oracle.
 *
 * It fills [mem_start, mem_start+mem_bytes) with a pattern derived from
 * (page index, generation, word index), then keeps rewriting the first
 * working_set_bytes of it, one generation per pass, waiting page_delay_tsc
 * TSC ticks per page to set the dirtying rate. Every page carries its own
 * index and generation in its first two words and a per-page sequence in
 * the rest, so a stale, misplaced or torn page is detected by verify(),
 * which checks every word of every page against the generation it must
 * hold.
 *
 * Parameters come from the parameter block (guest.h); defaults: 16 MiB at
 * 4 MiB, a 1 MiB working set, 16 passes, no delay, a verification every
 * second. passes = ~0 runs until the VM is stopped.
 *
 * Verification happens at the end of a bounded run, every
 * verify_every_sec seconds of dirtying (mid-pass too: the pages already
 * rewritten must hold the new generation, the rest of the working set the
 * previous one), and whenever the host changes the verify-request word:
 * then the guest verifies, prints the result and copies the request to the
 * ack word. Each prints "dirty: verify PASS generation N" or
 * "dirty: verify FAIL page P want generation G found H", then
 * "dirty: verified N MiB in M ms"; each periodic one is preceded by
 * "dirty: rate N MiB/s", the rate of distinct pages dirtied since the last
 * (time spent verifying excluded). A bounded run ends with the overall rate
 * and "dirty: max progress gap N tsc ticks", the longest time the guest
 * did not run (between two page writes or looks at the clock while it
 * waits between pages, or every few pages it verifies: the guest-visible
 * downtime of a migration). A continuous run instead prints "dirty:
 * progress gap N us" for every gap over 1 ms, as it happens, and before
 * each verification "dirty: largest gap N us", the longest gap since the
 * previous one however short, so a host reads a migration's downtime from
 * the console whenever the migration pauses it, under 1 ms too. The gap
 * clock never stops: printing ticks it after every byte, so a stall while
 * the guest prints (or verifies) is a gap, and its own printing is not.
 * With idle = 1 it fills once and then dirties nothing: it only watches
 * the clock (gaps are reported as above), verifies every verify_every_sec
 * seconds (after "dirty: rate 0 MiB/s") and on request, and a bounded run
 * ends after passes such intervals: a migration's floor, with no page
 * for pre-copy to resend.
 * Exit status 0 when every verification passed, 1 otherwise.
 *
 * Everything runs at CPL3, where nested PVM runs it natively; the hot loops
 * store and compare one 64-bit word per step, with one hash per page.
 */
#include "guest.h"

#define PAGE 4096UL
#define WORDS (PAGE / 8)
#define PAGE_TAG 0x7465726e64697274ULL
#define WORD_STEP 0x9e3779b97f4a7c15ULL
#define MIB (1UL << 20)
#define TIME_CHECK_PAGES 64	/* pages between looks at the verify clock */
#define VERIFY_CLOCK_PAGES 8	/* pages verified between looks at the clock */

/* page_seed is the start of page's sequence in generation gen. */
static u64 page_seed(u64 page, u64 gen)
{
	u64 x = page * 0x9e3779b97f4a7c15ULL ^ gen * 0xbf58476d1ce4e5b9ULL;
	x ^= x >> 31;
	x *= 0x94d049bb133111ebULL;
	x ^= x >> 29;
	return x;
}

static void write_page(u64 *p, u64 page, u64 gen)
{
	u64 v = page_seed(page, gen);
	p[0] = page ^ PAGE_TAG;
	p[1] = gen;
	for (u64 w = 2; w < WORDS; w += 2) {
		p[w] = v + w * WORD_STEP;
		p[w + 1] = v + (w + 1) * WORD_STEP;
	}
}

static int page_ok(const u64 *p, u64 page, u64 gen)
{
	u64 v = page_seed(page, gen), bad = (p[0] ^ page ^ PAGE_TAG) | (p[1] ^ gen);
	for (u64 w = 2; w < WORDS; w += 2)
		bad |= (p[w] ^ (v + w * WORD_STEP)) | (p[w + 1] ^ (v + (w + 1) * WORD_STEP));
	return bad == 0;
}

static u64 max_gap, last_tsc;
/* interval_gap: the longest gap since the last "largest gap" line. */
static u64 interval_gap;
/* report_ticks: in continuous mode, a gap longer than this is printed. */
static u64 report_ticks;
/* pending_gap: the longest gap over report_ticks not printed yet. */
static u64 pending_gap;
/*
 * reporting is set while a "progress gap" line prints: a gap then still
 * counts (max_gap, interval_gap) but queues no line of its own. Where one
 * byte of output costs more than report_ticks (a UART exit in an emulated
 * host can), each report would otherwise queue the next, and the guest
 * would print gap lines for ever instead of dirtying and verifying.
 */
static int reporting;

/*
 * tick records that the guest ran and returns the TSC: the time since the
 * previous tick is a gap. The clock is never reset: printing ticks it
 * after every byte (out), so a pause while the guest prints is a gap like
 * any other, and its own printing (a few port writes per byte) is not.
 */
static u64 tick(void)
{
	u64 now = rdtsc();
	if (last_tsc) {
		u64 gap = now - last_tsc;
		if (gap > max_gap)
			max_gap = gap;
		if (gap > interval_gap)
			interval_gap = gap;
		if (report_ticks && !reporting && gap > report_ticks && gap > pending_gap)
			pending_gap = gap;
	}
	last_tsc = now;
	return now;
}

/* out prints s one byte at a time, ticking the gap clock after each. */
static void out(const char *s)
{
	char one[2] = {0, 0};
	for (; *s; s++) {
		one[0] = *s;
		puts(one);
		tick();
	}
}

static void outdec(u64 v)
{
	char buf[21];
	int i = 20;
	buf[i] = 0;
	do {
		buf[--i] = (char)('0' + v % 10);
		v /= 10;
	} while (v);
	out(buf + i);
}

/*
 * progress records that the guest ran (a page written, a look at the
 * clock while it waits between pages, or a few pages verified) and
 * returns the TSC. A gap longer than report_ticks is printed as "dirty:
 * progress gap N us" (a gap while that line prints counts towards the
 * largest gap but gets no line of its own).
 */
static u64 progress(void)
{
	u64 now = tick();
	if (pending_gap) {
		u64 gap = pending_gap;
		pending_gap = 0;
		reporting = 1;
		out("dirty: progress gap ");
		outdec(gap * 1000 / tsc_khz());
		out(" us\n");
		reporting = 0;
		now = last_tsc;
	}
	return now;
}

/*
 * largest_gap prints, in continuous mode, "dirty: largest gap N us": the
 * longest gap since the previous such line, whatever its length (so a
 * host sees a migration's pause under 1 ms too, with its value).
 */
static void largest_gap(void)
{
	if (!report_ticks)
		return;
	u64 gap = interval_gap;
	interval_gap = 0;
	out("dirty: largest gap ");
	outdec(gap * 1000 / tsc_khz());
	out(" us\n");
}

static void print_mib_rate(const char *what, u64 pages, u64 ticks)
{
	u64 us = ticks * 1000 / tsc_khz();
	out(what);
	outdec(us ? pages * 1000000 / (us * (MIB / PAGE)) : 0);
	out(" MiB/s\n");
}

/*
 * verify checks every page: [0, done) must hold gen, [done, ws_pages) the
 * previous generation, the rest generation 0. It returns 0 when all do.
 */
static int verify(u64 *base, u64 pages, u64 ws_pages, u64 gen, u64 done)
{
	u64 t0 = rdtsc();
	for (u64 i = 0; i < pages; i++) {
		u64 *p = base + i * WORDS;
		if (i % VERIFY_CLOCK_PAGES == 0)
			progress();	/* a stall mid-verification is a gap */
		u64 want = i < done ? gen : i < ws_pages && gen ? gen - 1 : 0;
		if (!page_ok(p, i, want)) {
			out("dirty: verify FAIL page ");
			outdec(i);
			out(" want generation ");
			outdec(want);
			out(" found ");
			outdec(p[1]);
			out("\n");
			return 1;
		}
	}
	u64 ms = ticks_to_ms(rdtsc() - t0);
	out("dirty: verify PASS generation ");
	outdec(gen);
	out("\ndirty: verified ");
	outdec(pages * PAGE / MIB);
	out(" MiB in ");
	outdec(ms);
	out(" ms\n");
	return 0;
}

/*
 * idle runs instead of the dirtying loop when the idle parameter is 1:
 * it writes nothing more, but keeps looking at the clock (so a pause is
 * still a progress gap), verifies generation 0 every verify_ticks, each
 * time after "dirty: rate 0 MiB/s", and whenever the host changes the
 * verify-request word. A bounded run (intervals > 0) ends after that many
 * intervals, the last one's verification being the final one, with the
 * lines a dirtying run ends with.
 */
static int idle(u64 *base, u64 pages, u64 intervals, u64 verify_ticks)
{
	volatile u64 *request = (volatile u64 *)(PARAMS_ADDR + P_VERIFY_REQUEST);
	volatile u64 *ack = (volatile u64 *)(PARAMS_ADDR + P_VERIFY_ACK);
	u64 seen_request = *request;
	u64 verify_at = rdtsc() + verify_ticks;
	u64 elapsed = 0;
	int failed = 0;

	out("dirty: idle, dirtying nothing\n");
	for (;;) {
		u64 now = progress();
		u64 req = *request;
		if (now < verify_at && req == seen_request)
			continue;
		if (now >= verify_at) {
			out("dirty: rate 0 MiB/s\n");
			if (intervals && ++elapsed == intervals)
				break;
		}
		largest_gap();
		failed |= verify(base, pages, pages, 0, 0);
		if (req != seen_request) {
			seen_request = req;
			*ack = req;
		}
		verify_at = rdtsc() + verify_ticks;
	}
	failed |= verify(base, pages, pages, 0, 0);
	out("dirty: max progress gap ");
	outdec(max_gap);
	out(" tsc ticks\n");
	return failed;
}

int main(void)
{
	u64 start = param(P_MEM_START, 4UL << 20);
	u64 bytes = param(P_MEM_BYTES, 16UL << 20);
	u64 ws = param(P_WORKING_SET, 1UL << 20);
	u64 passes = param(P_PASSES, 16);
	u64 delay = param(P_PAGE_DELAY, 0);
	u64 verify_ticks = param(P_VERIFY_EVERY_SEC, 1) * tsc_khz() * 1000;
	volatile u64 *request = (volatile u64 *)(PARAMS_ADDR + P_VERIFY_REQUEST);
	volatile u64 *ack = (volatile u64 *)(PARAMS_ADDR + P_VERIFY_ACK);
	int forever = passes == ~0ULL;
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
	puts(" pages\ndirty: tsc ");
	putdec(tsc_khz());
	puts(param(P_TSC_KHZ, 0) ? " kHz\n" : " kHz (assumed)\n");
	if (ws_pages == 0) {
		puts("dirty: FAIL working set under one page\n");
		return 2;
	}

	u64 t0 = rdtsc();
	for (u64 i = 0; i < pages; i++)
		write_page(base + i * WORDS, i, 0);
	u64 fill_ticks = rdtsc() - t0;
	puts("dirty: filled ");
	putdec(pages * PAGE / MIB);
	puts(" MiB in ");
	putdec(ticks_to_ms(fill_ticks));
	puts(" ms\n");

	if (forever)
		report_ticks = tsc_khz();	/* 1 ms */
	if (param(P_IDLE, 0) == 1)
		return idle(base, pages, forever ? 0 : passes, verify_ticks);
	u64 seen_request = *request;
	u64 gen = 1, next = 0;			/* next page to write, in gen */
	u64 written = 0, dirty_ticks = 0;	/* since the last rate line */
	u64 total_written = 0, total_ticks = 0;
	u64 since = rdtsc();			/* start of the current stretch */
	u64 verify_at = since + verify_ticks;
	for (;;) {
		write_page(base + next * WORDS, next, gen);
		u64 now = progress();
		for (; delay && progress() - now < delay;)
			;
		written++;
		if (++next == ws_pages) {
			if (!forever && gen == passes)
				break;
			next = 0;
			gen++;
		} else if (written % TIME_CHECK_PAGES) {
			continue;
		}
		now = rdtsc();
		u64 req = *request;
		if (now < verify_at && req == seen_request)
			continue;
		dirty_ticks += now - since;
		if (now >= verify_at) {
			print_mib_rate("dirty: rate ", written, dirty_ticks);
			total_written += written;
			total_ticks += dirty_ticks;
			written = dirty_ticks = 0;
		}
		largest_gap();
		failed |= verify(base, pages, ws_pages, gen, next);
		if (req != seen_request) {
			seen_request = req;
			*ack = req;
		}
		since = rdtsc();
		verify_at = since + verify_ticks;
	}
	dirty_ticks += rdtsc() - since;
	failed |= verify(base, pages, ws_pages, gen, ws_pages);
	print_mib_rate("dirty: rate ", total_written + written, total_ticks + dirty_ticks);
	out("dirty: max progress gap ");
	outdec(max_gap);
	out(" tsc ticks\n");
	return failed;
}
