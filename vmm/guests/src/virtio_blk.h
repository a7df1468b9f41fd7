/*
 * virtio_blk.h: a minimal virtio-blk driver over virtio-mmio (virtio 1.x,
 * modern register layout only; QEMU needs -global
 * virtio-mmio.force-legacy=false), shared by the disk and demo guests, and
 * the sector pattern they write.
 *
 * One device, one 8-entry split virtqueue, one request at a time: the
 * driver polls the used ring and takes no interrupts. The caller owns the
 * data buffers: guest memory is identity-mapped, so a buffer's address is
 * its guest-physical address and any buffer will do.
 */
#ifndef TERN_VIRTIO_BLK_H
#define TERN_VIRTIO_BLK_H

#include "guest.h"

#define SECTOR 512UL

/* Request types (virtio 1.x, 5.2.6). */
enum { VBLK_T_IN = 0, VBLK_T_OUT = 1, VBLK_T_FLUSH = 4, VBLK_T_GET_ID = 8 };

/* VBLK_TIMEOUT is what vblk_submit returns when the device never answers. */
#define VBLK_TIMEOUT 0xff

/*
 * vblk_find looks for the first virtio-blk device: at the parameter
 * block's virtio_base, or by scanning QEMU microvm's virtio-mmio slots
 * from 0xfeb00000. It returns 1 when it found one.
 */
int vblk_find(void);

/*
 * vblk_setup resets the device found by vblk_find, negotiates VERSION_1
 * (and FLUSH when offered) and sets up its queue. It returns 1 on success.
 */
int vblk_setup(void);

/* vblk_capacity is the device's size in 512-byte sectors. */
u64 vblk_capacity(void);

/* vblk_has_flush reports whether the device negotiated FLUSH. */
int vblk_has_flush(void);

/*
 * vblk_submit runs one request (len bytes of data at sector; no data for
 * a flush) and returns its status byte: 0 for success, VBLK_TIMEOUT when
 * the device did not complete it.
 */
u8 vblk_submit(u32 type, u64 sector, void *data, u32 len);

/*
 * sector_pattern is word w (0-63) of the pattern the guests write to
 * sector under seed (guests.DiskPattern on the Go side).
 */
static inline u64 sector_pattern(u64 seed, u64 sector, u64 w)
{
	u64 x = seed ^ (sector * 0x9e3779b97f4a7c15ULL) ^ (w << 32);
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdULL;
	x ^= x >> 33;
	return x;
}

#endif
