/*
 * virtio_net.h: a minimal virtio-net driver over virtio-mmio (virtio 1.x,
 * modern register layout), for the udp guest.
 *
 * One card, its receive queue (0) kept full of RX_BUFS buffers and its
 * transmit queue (1) sending one frame at a time. The driver polls both
 * used rings and takes no interrupts. Frames are Ethernet frames without
 * the virtio-net header, which the driver adds and strips.
 */
#ifndef TERN_VIRTIO_NET_H
#define TERN_VIRTIO_NET_H

#include "guest.h"

/* FRAME_MAX is the largest frame vnet_send takes and vnet_poll returns. */
#define FRAME_MAX 1514

/*
 * vnet_find looks for the first virtio-net device among the virtio-mmio
 * slots from 0xfeb00000 (tern's and QEMU microvm's). It returns 1 when it
 * found one.
 */
int vnet_find(void);

/*
 * vnet_setup resets the card found by vnet_find, negotiates VERSION_1
 * (and MAC when offered), fills the receive queue and readies both
 * queues. It returns 1 on success.
 */
int vnet_setup(void);

/* vnet_mac copies the card's address (all zero without MAC) to mac. */
void vnet_mac(u8 mac[6]);

/*
 * vnet_poll returns the next received frame and its length in *len, or 0
 * when none is waiting. The frame stays valid until the next vnet_poll.
 */
const u8 *vnet_poll(u32 *len);

/*
 * vnet_rx_taken returns the receive queue's used index up to which
 * vnet_poll has taken frames in (it counts frames, modulo 2^16).
 */
u16 vnet_rx_taken(void);

/*
 * vnet_send transmits a frame of len bytes (at most FRAME_MAX) and waits
 * until the device has taken it. It returns 1 on success.
 */
int vnet_send(const u8 *frame, u32 len);

#endif
