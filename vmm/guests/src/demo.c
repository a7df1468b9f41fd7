/*
 * demo: a guest that stays running, as a demonstration VM does: every
 * second it writes a few sectors of its disk, flushes, reads them back and
 * verifies them, and it echoes what is typed on the serial console.
 *
 * At start it finds the first virtio-blk device (virtio_blk.c: the
 * virtio_base parameter, or a scan of QEMU microvm's slots) and prints
 * "demo: disk id <id>" and "demo: ready, disk N sectors", or, without a
 * usable device, "demo: no disk" (with ": <reason>" when a device was
 * there but would not set up) and "demo: ready, no disk". Then it loops
 * forever:
 *
 *   - Once a second by the TSC (scaled by tsc_khz), round R (from 1)
 *     writes `sectors` sectors (default 4, at most 8) starting at sector
 *     ((R-1) * sectors) mod the disk's whole slots of that size, each
 *     holding the pattern of (seed ^ R * ROUND_MIX, sector); it flushes,
 *     reads them back, verifies and prints "demo: round R wrote W sectors,
 *     verified V, ok", or "demo: round R FAIL sector S" (or "FAIL write
 *     request", "FAIL flush request", "FAIL read request") and carries on.
 *     Without a disk it prints "demo: round R no disk". A round that comes
 *     due late (the VM was paused) runs once, and the next is a second
 *     after it: missed rounds are skipped, not caught up.
 *   - Between rounds it reads the UART (line.c) and prints each line as
 *     "demo: echo <line>"; the line "quit" makes it print "demo: bye" and
 *     exit with 0.
 */
#include "line.h"
#include "virtio_blk.h"

#define DEFAULT_SEED 0x7465726eULL
#define DEFAULT_SECTORS_PER_ROUND 4
#define MAX_SECTORS_PER_ROUND 8
/* ROUND_MIX folds the round into the seed (guests.DemoPattern). */
#define ROUND_MIX 0xc2b2ae3d27d4eb4fULL
#define WORDS_PER_SECTOR (SECTOR / 8)

static u8 buf[MAX_SECTORS_PER_ROUND * SECTOR] __attribute__((aligned(4096)));

/* The disk, once set up; per_round is 0 without one. */
static u64 seed, per_round, capacity;

static void round_start(u64 round)
{
	puts("demo: round ");
	putdec(round);
}

static void round_fail(u64 round, const char *what)
{
	round_start(round);
	puts(" FAIL ");
	puts(what);
	puts("\n");
}

/* run_round writes, flushes, reads back and verifies round's sectors. */
static void run_round(u64 round)
{
	if (!per_round) {
		round_start(round);
		puts(" no disk\n");
		return;
	}
	u64 first = (round - 1) * per_round % (capacity - capacity % per_round);
	u64 round_seed = seed ^ round * ROUND_MIX;
	u64 *words = (u64 *)buf;
	u64 nwords = per_round * WORDS_PER_SECTOR;
	u32 len = (u32)(per_round * SECTOR);

	for (u64 w = 0; w < nwords; w++)
		words[w] = sector_pattern(round_seed, first + w / WORDS_PER_SECTOR, w % WORDS_PER_SECTOR);
	if (vblk_submit(VBLK_T_OUT, first, buf, len) != 0)
		return round_fail(round, "write request");
	if (vblk_has_flush() && vblk_submit(VBLK_T_FLUSH, 0, 0, 0) != 0)
		return round_fail(round, "flush request");
	memset(buf, 0, len);
	if (vblk_submit(VBLK_T_IN, first, buf, len) != 0)
		return round_fail(round, "read request");
	for (u64 w = 0; w < nwords; w++) {
		u64 sector = first + w / WORDS_PER_SECTOR;
		if (words[w] != sector_pattern(round_seed, sector, w % WORDS_PER_SECTOR)) {
			round_start(round);
			puts(" FAIL sector ");
			putdec(sector);
			puts("\n");
			return;
		}
	}
	round_start(round);
	puts(" wrote ");
	putdec(per_round);
	puts(" sectors, verified ");
	putdec(per_round);
	puts(", ok\n");
}

/* setup_disk sets up the disk, or leaves per_round 0 and says why not. */
static void setup_disk(void)
{
	u64 want = param(P_SECTORS, DEFAULT_SECTORS_PER_ROUND);

	if (!vblk_find()) {
		puts("demo: no disk\n");
		return;
	}
	if (!vblk_setup()) {
		puts("demo: no disk: device setup failed\n");
		return;
	}
	capacity = vblk_capacity();
	if (capacity == 0) {
		puts("demo: no disk: 0 sectors\n");
		return;
	}
	if (want > MAX_SECTORS_PER_ROUND)
		want = MAX_SECTORS_PER_ROUND;
	if (want > capacity)
		want = capacity;
	per_round = want;
	memset(buf, 0, 21);
	if (vblk_submit(VBLK_T_GET_ID, 0, buf, 20) == 0) {
		puts("demo: disk id ");
		puts((const char *)buf);
		puts("\n");
	}
}

int main(void)
{
	struct line_reader r;

	seed = param(P_SEED, DEFAULT_SEED);
	setup_disk();
	if (per_round) {
		puts("demo: ready, disk ");
		putdec(capacity);
		puts(" sectors\n");
	} else {
		puts("demo: ready, no disk\n");
	}

	line_init(&r);
	u64 period = tsc_khz() * 1000;
	u64 next = rdtsc();
	for (u64 round = 1;;) {
		const char *line = line_read(&r, next);
		if (line) {
			puts("demo: echo ");
			puts(line);
			puts("\n");
			if (line_equals(line, "quit")) {
				puts("demo: bye\n");
				return 0;
			}
			continue;
		}
		run_round(round++);
		u64 now = rdtsc();
		next += period;
		if (next <= now)
			next = now + period;
	}
}
