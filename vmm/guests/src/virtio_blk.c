/*
 * virtio_blk.c: the virtio-blk driver of virtio_blk.h. It runs at CPL3:
 * virtio-mmio is MMIO on user pages, so it needs no port and no privilege.
 */
#include "virtio_blk.h"

#define VIRTIO_MAGIC 0x74726976
#define SCAN_BASE 0xfeb00000UL
#define SCAN_STRIDE 0x200UL
#define SCAN_SLOTS 32

enum {
	R_MAGIC = 0x000, R_VERSION = 0x004, R_DEVICE_ID = 0x008,
	R_DEVICE_FEATURES = 0x010, R_DEVICE_FEATURES_SEL = 0x014,
	R_DRIVER_FEATURES = 0x020, R_DRIVER_FEATURES_SEL = 0x024,
	R_QUEUE_SEL = 0x030, R_QUEUE_NUM_MAX = 0x034, R_QUEUE_NUM = 0x038,
	R_QUEUE_READY = 0x044, R_QUEUE_NOTIFY = 0x050,
	R_INTERRUPT_STATUS = 0x060, R_INTERRUPT_ACK = 0x064, R_STATUS = 0x070,
	R_QUEUE_DESC_LOW = 0x080, R_QUEUE_DESC_HIGH = 0x084,
	R_QUEUE_DRIVER_LOW = 0x090, R_QUEUE_DRIVER_HIGH = 0x094,
	R_QUEUE_DEVICE_LOW = 0x0a0, R_QUEUE_DEVICE_HIGH = 0x0a4,
	R_CONFIG = 0x100,
};

enum { S_ACK = 1, S_DRIVER = 2, S_DRIVER_OK = 4, S_FEATURES_OK = 8, S_FAILED = 128 };
enum { F_NEXT = 1, F_WRITE = 2 };

#define QSIZE 8
#define FEATURE_FLUSH (1u << 9)

struct desc { u64 addr; u32 len; u16 flags; u16 next; };
struct avail { u16 flags; u16 idx; u16 ring[QSIZE]; u16 used_event; };
struct used_elem { u32 id; u32 len; };
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
	for (unsigned i = 0; i < SCAN_SLOTS; i++)
		if (probe(SCAN_BASE + i * SCAN_STRIDE))
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
	wr(R_STATUS, 0);
	wr(R_STATUS, S_ACK);
	wr(R_STATUS, S_ACK | S_DRIVER);
	wr(R_DEVICE_FEATURES_SEL, 1);
	if (!(rd(R_DEVICE_FEATURES) & 1))	/* VIRTIO_F_VERSION_1 */
		return 0;
	wr(R_DEVICE_FEATURES_SEL, 0);
	features = rd(R_DEVICE_FEATURES) & FEATURE_FLUSH;
	wr(R_DRIVER_FEATURES_SEL, 0);
	wr(R_DRIVER_FEATURES, features);
	wr(R_DRIVER_FEATURES_SEL, 1);
	wr(R_DRIVER_FEATURES, 1);
	wr(R_STATUS, S_ACK | S_DRIVER | S_FEATURES_OK);
	if (!(rd(R_STATUS) & S_FEATURES_OK))
		return 0;
	wr(R_QUEUE_SEL, 0);
	if (rd(R_QUEUE_NUM_MAX) < QSIZE)
		return 0;
	wr(R_QUEUE_NUM, QSIZE);
	wr(R_QUEUE_DESC_LOW, (u32)(uptr)descs);
	wr(R_QUEUE_DESC_HIGH, 0);
	wr(R_QUEUE_DRIVER_LOW, (u32)(uptr)&avail);
	wr(R_QUEUE_DRIVER_HIGH, 0);
	wr(R_QUEUE_DEVICE_LOW, (u32)(uptr)&used);
	wr(R_QUEUE_DEVICE_HIGH, 0);
	wr(R_QUEUE_READY, 1);
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
