/*
 * virtio_net.c: the virtio-net driver of virtio_net.h. Like virtio_blk.c
 * it runs at CPL3 on identity-mapped memory, so a buffer's address is its
 * guest-physical address.
 */
#include "virtio_net.h"

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

enum { S_ACK = 1, S_DRIVER = 2, S_DRIVER_OK = 4, S_FEATURES_OK = 8 };
enum { F_WRITE = 2 };

#define DEVICE_NET 1
#define FEATURE_MAC (1u << 5)
/* HDR is struct virtio_net_hdr with VERSION_1: 12 bytes, all zero on send. */
#define HDR 12
#define QSIZE 16
#define RX_BUFS QSIZE
#define BUF (HDR + FRAME_MAX)

struct desc { u64 addr; u32 len; u16 flags; u16 next; };
struct avail { u16 flags; u16 idx; u16 ring[QSIZE]; u16 used_event; };
struct used_elem { u32 id; u32 len; };
struct used { u16 flags; u16 idx; struct used_elem ring[QSIZE]; u16 avail_event; };

/* A queue: its three rings (each on its own page) and the used index seen. */
struct queue {
	struct desc descs[QSIZE] __attribute__((aligned(4096)));
	struct avail avail __attribute__((aligned(4096)));
	struct used used __attribute__((aligned(4096)));
	u16 last_used;
};

static struct queue rxq, txq;
static u8 rx_bufs[RX_BUFS][BUF] __attribute__((aligned(64)));
static u8 tx_buf[BUF] __attribute__((aligned(64)));
static u32 features;
static uptr dev;
/* pending is the receive buffer vnet_poll returned last, to post again. */
static int pending = -1;

static u32 rd(unsigned r) { return mmio_read32(dev + r); }
static void wr(unsigned r, u32 v) { mmio_write32(dev + r, v); }

int vnet_find(void)
{
	for (unsigned i = 0; i < SCAN_SLOTS; i++) {
		dev = SCAN_BASE + i * SCAN_STRIDE;
		if (rd(R_MAGIC) == VIRTIO_MAGIC && rd(R_VERSION) == 2 && rd(R_DEVICE_ID) == DEVICE_NET)
			return 1;
	}
	return 0;
}

/* post makes descriptor id available on q (the caller notifies). */
static void post(struct queue *q, u16 id)
{
	q->avail.ring[q->avail.idx % QSIZE] = id;
	barrier();
	*(volatile u16 *)&q->avail.idx = q->avail.idx + 1;
	barrier();
}

static int ready_queue(unsigned n, struct queue *q)
{
	wr(R_QUEUE_SEL, n);
	if (rd(R_QUEUE_NUM_MAX) < QSIZE)
		return 0;
	wr(R_QUEUE_NUM, QSIZE);
	wr(R_QUEUE_DESC_LOW, (u32)(uptr)q->descs);
	wr(R_QUEUE_DESC_HIGH, 0);
	wr(R_QUEUE_DRIVER_LOW, (u32)(uptr)&q->avail);
	wr(R_QUEUE_DRIVER_HIGH, 0);
	wr(R_QUEUE_DEVICE_LOW, (u32)(uptr)&q->used);
	wr(R_QUEUE_DEVICE_HIGH, 0);
	wr(R_QUEUE_READY, 1);
	return 1;
}

int vnet_setup(void)
{
	wr(R_STATUS, 0);
	wr(R_STATUS, S_ACK);
	wr(R_STATUS, S_ACK | S_DRIVER);
	wr(R_DEVICE_FEATURES_SEL, 1);
	if (!(rd(R_DEVICE_FEATURES) & 1))	/* VIRTIO_F_VERSION_1 */
		return 0;
	wr(R_DEVICE_FEATURES_SEL, 0);
	features = rd(R_DEVICE_FEATURES) & FEATURE_MAC;
	wr(R_DRIVER_FEATURES_SEL, 0);
	wr(R_DRIVER_FEATURES, features);
	wr(R_DRIVER_FEATURES_SEL, 1);
	wr(R_DRIVER_FEATURES, 1);
	wr(R_STATUS, S_ACK | S_DRIVER | S_FEATURES_OK);
	if (!(rd(R_STATUS) & S_FEATURES_OK))
		return 0;
	for (u16 i = 0; i < RX_BUFS; i++) {
		rxq.descs[i] = (struct desc){ (uptr)rx_bufs[i], BUF, F_WRITE, 0 };
		post(&rxq, i);
	}
	if (!ready_queue(0, &rxq) || !ready_queue(1, &txq))
		return 0;
	wr(R_STATUS, S_ACK | S_DRIVER | S_FEATURES_OK | S_DRIVER_OK);
	wr(R_QUEUE_NOTIFY, 0);
	return 1;
}

void vnet_mac(u8 mac[6])
{
	for (unsigned i = 0; i < 6; i++)
		mac[i] = (features & FEATURE_MAC) ? *(volatile u8 *)(dev + R_CONFIG + i) : 0;
}

u16 vnet_rx_taken(void) { return rxq.last_used; }

const u8 *vnet_poll(u32 *len)
{
	if (pending >= 0) {
		post(&rxq, (u16)pending);
		wr(R_QUEUE_NOTIFY, 0);
		pending = -1;
	}
	for (;;) {
		if (*(volatile u16 *)&rxq.used.idx == rxq.last_used)
			return 0;
		barrier();
		struct used_elem e = rxq.used.ring[rxq.last_used % QSIZE];
		rxq.last_used++;
		if (e.id >= RX_BUFS)
			continue;	/* a device's bad id: nothing to post again */
		if (e.len <= HDR || e.len > BUF) {
			post(&rxq, (u16)e.id);
			wr(R_QUEUE_NOTIFY, 0);
			continue;
		}
		pending = (int)e.id;
		*len = e.len - HDR;
		return rx_bufs[e.id] + HDR;
	}
}

int vnet_send(const u8 *frame, u32 len)
{
	if (len > FRAME_MAX)
		return 0;
	memset(tx_buf, 0, HDR);
	memcpy(tx_buf + HDR, frame, len);
	txq.descs[0] = (struct desc){ (uptr)tx_buf, HDR + len, 0, 0 };
	post(&txq, 0);
	wr(R_QUEUE_NOTIFY, 1);
	for (u64 spin = 0; *(volatile u16 *)&txq.used.idx == txq.last_used; spin++) {
		if (spin > 2000000000ULL)
			return 0;
		__asm__ volatile("pause");
	}
	barrier();
	txq.last_used++;
	return 1;
}
