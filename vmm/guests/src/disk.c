/*
 * disk: writes, flushes, reads back and verifies a pattern on the first
 * virtio-blk device, through the driver in virtio_blk.c.
 *
 * It finds the device (at the parameter block's virtio_base, or by
 * scanning QEMU microvm's virtio-mmio slots), prints the disk's GET_ID
 * string, writes `sectors` sectors of a pattern derived from `seed`,
 * flushes (when the device offers FLUSH), reads them back and verifies.
 * It prints "disk: PASS N sectors" and exits 0, or "disk: FAIL sector N"
 * and exits 1 (2 when no device or the device misbehaves).
 *
 * With `passes` other than 1 (~0: until stopped) it repeats, pass K
 * writing the pattern of seed + K, and prints "disk: PASS N sectors pass
 * K" after each: what a live migration in the middle of a pass must not
 * break.
 */
#include "virtio_blk.h"

#define CHUNK_SECTORS 8UL

static u8 buf[CHUNK_SECTORS * SECTOR] __attribute__((aligned(4096)));

static int fail(const char *what)
{
	puts("disk: FAIL ");
	puts(what);
	puts("\n");
	return 2;
}

/* one_pass writes, flushes, reads back and verifies one pattern. */
static int one_pass(u64 seed, u64 sectors)
{
	u64 *words = (u64 *)buf;
	for (u64 s = 0; s < sectors; s += CHUNK_SECTORS) {
		for (u64 w = 0; w < CHUNK_SECTORS * SECTOR / 8; w++)
			words[w] = sector_pattern(seed, s + w / (SECTOR / 8), w % (SECTOR / 8));
		if (vblk_submit(VBLK_T_OUT, s, buf, sizeof buf) != 0)
			return fail("write request");
	}
	if (vblk_has_flush() && vblk_submit(VBLK_T_FLUSH, 0, 0, 0) != 0)
		return fail("flush request");
	for (u64 s = 0; s < sectors; s += CHUNK_SECTORS) {
		memset(buf, 0, sizeof buf);
		if (vblk_submit(VBLK_T_IN, s, buf, sizeof buf) != 0)
			return fail("read request");
		for (u64 w = 0; w < CHUNK_SECTORS * SECTOR / 8; w++) {
			u64 sector = s + w / (SECTOR / 8);
			if (words[w] != sector_pattern(seed, sector, w % (SECTOR / 8))) {
				puts("disk: FAIL sector ");
				putdec(sector);
				puts("\n");
				return 1;
			}
		}
	}
	return 0;
}

int main(void)
{
	u64 seed = param(P_SEED, 0x7465726e);
	u64 sectors = param(P_SECTORS, 256);

	if (!vblk_find())
		return fail("no virtio-blk device");
	if (!vblk_setup())
		return fail("device setup");
	u64 capacity = vblk_capacity();
	if (sectors > capacity)
		sectors = capacity;
	sectors -= sectors % CHUNK_SECTORS;

	memset(buf, 0, 21);
	if (vblk_submit(VBLK_T_GET_ID, 0, buf, 20) == 0) {
		puts("disk: id ");
		puts((const char *)buf);
		puts("\n");
	}

	u64 passes = param(P_PASSES, 1);
	for (u64 pass = 0; passes == ~0ULL || pass < passes; pass++) {
		int r = one_pass(seed + pass, sectors);
		if (r != 0)
			return r;
		puts("disk: PASS ");
		putdec(sectors);
		puts(" sectors");
		if (passes != 1) {
			puts(" pass ");
			putdec(pass);
		}
		puts("\n");
	}
	return 0;
}
