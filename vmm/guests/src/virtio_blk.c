/*
 * virtio_blk.c: the virtio-blk driver of virtio_blk.h. It runs at CPL3:
 * virtio-mmio is MMIO on user pages, so it needs no port and no privilege.
 */
#include "virtio_blk.h"
#include "virtio_mmio.h"

#define QSIZE 8
#define FEATURE_FLUSH (1u << 9)

struct avail { u16 flags; u16 idx; u16 ring[QSIZE]; u16 used_event; };
struct used { u16 flags; u16 idx; struct used_elem ring[QSIZE]; u16 avail_event; };
struct req_hdr { u32 type; u32 reserved; u64 sector; };

static struct desc descs[QSIZE] __attribute__((aligned(4096)));
static struct avail avail __attribute__((aligned(4096)));
static struct used used __attribute__((aligned(4096)));
static struct req_hdr hdr __attribute__((aligned(16)));
static u8 status_byte __attribute__((aligned(16)));
static u16 last_used;
static u32 features;
static uptr dev;

static u32 rd(unsigned r) { return mmio_read32(dev + r); }
static void wr(unsigned r, u32 v) { mmio_write32(dev + r, v); }

static int probe(uptr base)
{
	dev = base;
	return rd(R_MAGIC) == VIRTIO_MAGIC && rd(R_VERSION) == 2 && rd(R_DEVICE_ID) == 2;
}

int vblk_find(void)
{
	uptr base = param(P_VIRTIO_BASE, 0);
	if (base)
		return probe(base);
	for (unsigned i = 0; i < VIRTIO_SCAN_SLOTS; i++)
		if (probe(VIRTIO_SCAN_BASE + i * VIRTIO_SCAN_STRIDE))
			return 1;
	return 0;
}

u8 vblk_submit(u32 type, u64 sector, void *data, u32 len)
{
	hdr.type = type;
	hdr.reserved = 0;
	hdr.sector = sector;
	status_byte = VBLK_TIMEOUT;
	descs[0] = (struct desc){ (uptr)&hdr, sizeof hdr, F_NEXT, 1 };
	if (len) {
		u16 dir = type == VBLK_T_OUT ? 0 : F_WRITE;
		descs[1] = (struct desc){ (uptr)data, len, F_NEXT | dir, 2 };
	} else {
		descs[0].next = 2;
	}
	descs[2] = (struct desc){ (uptr)&status_byte, 1, F_WRITE, 0 };
	avail.ring[avail.idx % QSIZE] = 0;
	barrier();
	*(volatile u16 *)&avail.idx = avail.idx + 1;
	barrier();
	wr(R_QUEUE_NOTIFY, 0);
	for (u64 spin = 0; *(volatile u16 *)&used.idx == last_used; spin++) {
		if (spin > 2000000000ULL)
			return VBLK_TIMEOUT;
		__asm__ volatile("pause");
	}
	barrier();
	last_used++;
	wr(R_INTERRUPT_ACK, rd(R_INTERRUPT_STATUS));
	return *(volatile u8 *)&status_byte;
}

int vblk_setup(void)
{
	if (!virtio_negotiate(dev, FEATURE_FLUSH, &features))
		return 0;
	if (!virtio_ready_queue(dev, 0, QSIZE, descs, &avail, &used))
		return 0;
	wr(R_STATUS, S_ACK | S_DRIVER | S_FEATURES_OK | S_DRIVER_OK);
	return 1;
}

u64 vblk_capacity(void)
{
	return (u64)rd(R_CONFIG) | (u64)rd(R_CONFIG + 4) << 32;
}

int vblk_has_flush(void)
{
	return (features & FEATURE_FLUSH) != 0;
}
