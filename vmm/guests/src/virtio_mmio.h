/*
 * virtio_mmio.h: the virtio-mmio transport (virtio 1.x, modern register
 * layout) as the test guests' drivers (virtio_blk.c, virtio_net.c) use it:
 * the registers, the status and descriptor bits, the descriptor and used
 * element layouts, and the feature negotiation they share.
 */
#ifndef TERN_VIRTIO_MMIO_H
#define TERN_VIRTIO_MMIO_H

#include "guest.h"

#define VIRTIO_MAGIC 0x74726976
/* The slots tern (and QEMU's microvm) put virtio-mmio devices in. */
#define VIRTIO_SCAN_BASE 0xfeb00000UL
#define VIRTIO_SCAN_STRIDE 0x200UL
#define VIRTIO_SCAN_SLOTS 32

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

struct desc { u64 addr; u32 len; u16 flags; u16 next; };
struct used_elem { u32 id; u32 len; };

/*
 * virtio_negotiate resets the device at dev and negotiates VERSION_1 and
 * those of the low feature bits in want that it offers, which it stores
 * in *got. It returns 1 once the device took FEATURES_OK, 0 when it has
 * no VERSION_1 or refused.
 */
static inline int virtio_negotiate(uptr dev, u32 want, u32 *got)
{
	mmio_write32(dev + R_STATUS, 0);
	mmio_write32(dev + R_STATUS, S_ACK);
	mmio_write32(dev + R_STATUS, S_ACK | S_DRIVER);
	mmio_write32(dev + R_DEVICE_FEATURES_SEL, 1);
	if (!(mmio_read32(dev + R_DEVICE_FEATURES) & 1))	/* VIRTIO_F_VERSION_1 */
		return 0;
	mmio_write32(dev + R_DEVICE_FEATURES_SEL, 0);
	*got = mmio_read32(dev + R_DEVICE_FEATURES) & want;
	mmio_write32(dev + R_DRIVER_FEATURES_SEL, 0);
	mmio_write32(dev + R_DRIVER_FEATURES, *got);
	mmio_write32(dev + R_DRIVER_FEATURES_SEL, 1);
	mmio_write32(dev + R_DRIVER_FEATURES, 1);
	mmio_write32(dev + R_STATUS, S_ACK | S_DRIVER | S_FEATURES_OK);
	return (mmio_read32(dev + R_STATUS) & S_FEATURES_OK) != 0;
}

/*
 * virtio_ready_queue sets up queue n of the device at dev with size
 * entries and its three rings at desc, avail and used (identity-mapped,
 * below 4 GiB) and makes it ready. It returns 0 when the device's queue
 * is smaller than size.
 */
static inline int virtio_ready_queue(uptr dev, unsigned n, u32 size, const void *desc, const void *avail, const void *used)
{
	mmio_write32(dev + R_QUEUE_SEL, n);
	if (mmio_read32(dev + R_QUEUE_NUM_MAX) < size)
		return 0;
	mmio_write32(dev + R_QUEUE_NUM, size);
	mmio_write32(dev + R_QUEUE_DESC_LOW, (u32)(uptr)desc);
	mmio_write32(dev + R_QUEUE_DESC_HIGH, 0);
	mmio_write32(dev + R_QUEUE_DRIVER_LOW, (u32)(uptr)avail);
	mmio_write32(dev + R_QUEUE_DRIVER_HIGH, 0);
	mmio_write32(dev + R_QUEUE_DEVICE_LOW, (u32)(uptr)used);
	mmio_write32(dev + R_QUEUE_DEVICE_HIGH, 0);
	mmio_write32(dev + R_QUEUE_READY, 1);
	return 1;
}

#endif
