/*
 * virtio_net.c: the virtio-net driver of virtio_net.h. Like virtio_blk.c
 * it runs at CPL3 on identity-mapped memory, so a buffer's address is its
 * guest-physical address.
 */
#include "virtio_net.h"
#include "virtio_mmio.h"

#define DEVICE_NET 1
#define FEATURE_MAC (1u << 5)
/* HDR is struct virtio_net_hdr with VERSION_1: 12 bytes, all zero on send. */
#define HDR 12
#define QSIZE 16
#define RX_BUFS QSIZE
#define BUF (HDR + FRAME_MAX)

struct avail { u16 flags; u16 idx; u16 ring[QSIZE]; u16 used_event; };
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
	for (unsigned i = 0; i < VIRTIO_SCAN_SLOTS; i++) {
		dev = VIRTIO_SCAN_BASE + i * VIRTIO_SCAN_STRIDE;
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
	return virtio_ready_queue(dev, n, QSIZE, q->descs, &q->avail, &q->used);
}

int vnet_setup(void)
{
	if (!virtio_negotiate(dev, FEATURE_MAC, &features))
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
