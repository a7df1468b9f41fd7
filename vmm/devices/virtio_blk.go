package devices

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"tern/internal/blockio"
	"tern/vmm/memory"
)

// Virtio-blk constants (virtio 1.x, section 5.2).
const (
	// VirtioBlkDeviceID is the virtio device type of a block device.
	VirtioBlkDeviceID = 2

	FeatureSegMax  = 1 << 2 // VIRTIO_BLK_F_SEG_MAX
	FeatureBlkSize = 1 << 6 // VIRTIO_BLK_F_BLK_SIZE
	FeatureFlush   = 1 << 9 // VIRTIO_BLK_F_FLUSH

	BlkTypeIn    = 0
	BlkTypeOut   = 1
	BlkTypeFlush = 4
	BlkTypeGetID = 8

	BlkStatusOK     = 0
	BlkStatusIOErr  = 1
	BlkStatusUnsupp = 2

	// SectorSize is virtio-blk's addressing unit, whatever the backend's
	// block size.
	SectorSize = 512
	// blkIDBytes is the length of the GET_ID answer.
	blkIDBytes = 20
	// blkHeaderSize is the request header: type, reserved, sector.
	blkHeaderSize = 16
	// blkQueueSize is the maximum size of the one request queue.
	blkQueueSize = 256
	// BlkSegMax is the seg_max reported: the most data buffers in one
	// request. Without indirect descriptors a request's chain (header,
	// buffers, status) must fit the ring, so it is the queue's size less
	// two, as QEMU reports; a Linux driver sizes its requests by it (with
	// no SEG_MAX it sends one buffer per request).
	BlkSegMax = blkQueueSize - 2
)

// errBadRequest marks a request the device answers with an IO error.
var errBadRequest = errors.New("bad virtio-blk request")

// VirtioBlk is a virtio-blk device over a blockio.Device, serving one
// request queue.
type VirtioBlk struct {
	// Immutable after construction.
	backend blockio.Device
	name    string
	mem     *memory.Memory

	// bounce is the one-block buffer for read-modify-write; used only by
	// Process, which the transport serializes.
	bounce []byte
}

// NewVirtioBlk returns a block device named name (GET_ID's answer,
// truncated to 20 bytes) over backend, serving guest memory mem.
func NewVirtioBlk(backend blockio.Device, name string, mem *memory.Memory) *VirtioBlk {
	return &VirtioBlk{backend: backend, name: name, mem: mem, bounce: make([]byte, backend.BlockSize())}
}

// DeviceID returns VirtioBlkDeviceID.
func (b *VirtioBlk) DeviceID() uint32 { return VirtioBlkDeviceID }

// Features offers SEG_MAX, BLK_SIZE and FLUSH: what Linux's virtio_blk
// reads (capacity is always there; without MQ it uses one queue). FLUSH
// makes the driver run its cache in write-back mode and send a flush for
// each fsync, which returns only once the backend's Flush did.
func (b *VirtioBlk) Features() uint64 { return FeatureSegMax | FeatureBlkSize | FeatureFlush }

// QueueMaxSizes reports one queue.
func (b *VirtioBlk) QueueMaxSizes() []uint16 { return []uint16{blkQueueSize} }

// ReadConfig reads struct virtio_blk_config: capacity in sectors at 0,
// seg_max at 12, blk_size at 20; other fields (size_max, geometry, and
// those of features not offered) read zero.
func (b *VirtioBlk) ReadConfig(offset uint64, data []byte) {
	var cfg [24]byte
	binary.LittleEndian.PutUint64(cfg[0:], b.backend.SizeBytes()/SectorSize)
	binary.LittleEndian.PutUint32(cfg[12:], BlkSegMax)
	binary.LittleEndian.PutUint32(cfg[20:], uint32(b.backend.BlockSize()))
	clear(data)
	if offset < uint64(len(cfg)) {
		copy(data, cfg[offset:])
	}
}

// Process serves the available requests of the queue, at most the
// queue's size per call: a well-behaved driver never has more outstanding,
// and the bound keeps a guest that rewrites its own avail ring (a request
// can target it) from holding the device in an endless loop.
func (b *VirtioBlk) Process(ctx context.Context, _ int, vq *Virtqueue, features uint64) bool {
	used := false
	for range vq.size {
		head, ok, err := vq.Pop()
		if err != nil || !ok {
			return used
		}
		written := b.serve(ctx, vq, head, features)
		if vq.PushUsed(head, written) != nil {
			return used
		}
		used = true
	}
	return used
}

// serve runs one request and returns the bytes written to the guest,
// status included. A chain without a writable status byte gets no status
// and 0 bytes: there is nowhere to report the error.
func (b *VirtioBlk) serve(ctx context.Context, vq *Virtqueue, head uint16, features uint64) uint32 {
	chain, err := vq.Chain(head)
	if err != nil || len(chain) < 2 {
		return 0
	}
	last := chain[len(chain)-1]
	if !last.Write || last.Len == 0 {
		return 0
	}
	statusAddr := last.Addr + memory.GPA(last.Len-1)
	// The data buffers: the middle descriptors, plus the bytes of the
	// last descriptor before its status byte.
	data := chain[1 : len(chain)-1 : len(chain)-1]
	if last.Len > 1 {
		data = append(data, Desc{Addr: last.Addr, Len: last.Len - 1, Write: true})
	}
	status, n := b.execute(ctx, chain[0], data, features)
	if b.mem.PutUint8(statusAddr, status) != nil {
		return 0
	}
	return n + 1
}

// execute decodes the header and runs the request, returning its status
// and the data bytes written to the guest.
func (b *VirtioBlk) execute(ctx context.Context, hdrDesc Desc, data []Desc, features uint64) (uint8, uint32) {
	if hdrDesc.Write || hdrDesc.Len < blkHeaderSize {
		return BlkStatusIOErr, 0
	}
	hdr, err := b.mem.Slice(hdrDesc.Addr, blkHeaderSize)
	if err != nil {
		return BlkStatusIOErr, 0
	}
	typ := binary.LittleEndian.Uint32(hdr[0:])
	sector := binary.LittleEndian.Uint64(hdr[8:])
	switch typ {
	case BlkTypeIn, BlkTypeOut:
		n, err := b.transfer(ctx, typ == BlkTypeIn, sector, data)
		if err != nil {
			return BlkStatusIOErr, n
		}
		return BlkStatusOK, n
	case BlkTypeFlush:
		if features&FeatureFlush == 0 {
			return BlkStatusUnsupp, 0
		}
		if b.backend.Flush(ctx) != nil {
			return BlkStatusIOErr, 0
		}
		return BlkStatusOK, 0
	case BlkTypeGetID:
		if len(data) == 0 || !data[0].Write {
			return BlkStatusIOErr, 0
		}
		dst, err := b.mem.Slice(data[0].Addr, uint64(min(data[0].Len, blkIDBytes)))
		if err != nil {
			return BlkStatusIOErr, 0
		}
		var id [blkIDBytes]byte
		copy(id[:], b.name)
		n := copy(dst, id[:])
		b.mem.MarkDirty(data[0].Addr, uint64(n))
		return BlkStatusOK, uint32(n)
	}
	return BlkStatusUnsupp, 0
}

// transfer moves the data buffers to or from the disk starting at sector,
// in place. It returns the bytes written into guest memory.
func (b *VirtioBlk) transfer(ctx context.Context, read bool, sector uint64, data []Desc) (uint32, error) {
	size := b.backend.SizeBytes()
	if sector > size/SectorSize {
		return 0, fmt.Errorf("%w: sector %d past the end", errBadRequest, sector)
	}
	off := sector * SectorSize
	var total uint64
	for _, d := range data {
		total += uint64(d.Len)
		if d.Write != read {
			return 0, fmt.Errorf("%w: buffer direction", errBadRequest)
		}
	}
	if total > size-off {
		return 0, fmt.Errorf("%w: %d bytes at %d past the end of a %d-byte disk", errBadRequest, total, off, size)
	}
	var written uint32
	for _, d := range data {
		buf, err := b.mem.Slice(d.Addr, uint64(d.Len))
		if err != nil {
			return written, err
		}
		if read {
			err = b.readAt(ctx, buf, off)
			if err == nil {
				b.mem.MarkDirty(d.Addr, uint64(d.Len))
				written += d.Len
			}
		} else {
			err = b.writeAt(ctx, buf, off)
		}
		if err != nil {
			return written, err
		}
		off += uint64(d.Len)
	}
	return written, nil
}

// split cuts [off, off+len(p)) at the backend's block boundaries into an
// unaligned head, an aligned middle and an unaligned tail; each may be
// empty.
func (b *VirtioBlk) split(p []byte, off uint64) (head, mid, tail []byte) {
	bs := uint64(b.backend.BlockSize())
	if r := off % bs; r != 0 {
		n := min(uint64(len(p)), bs-r)
		head, p = p[:n], p[n:]
	}
	n := uint64(len(p)) &^ (bs - 1)
	return head, p[:n], p[n:]
}

// readAt reads into guest memory p from off: the aligned middle straight
// into p, unaligned edges through the bounce block.
func (b *VirtioBlk) readAt(ctx context.Context, p []byte, off uint64) error {
	head, mid, tail := b.split(p, off)
	bs := uint64(b.backend.BlockSize())
	if len(head) > 0 {
		if err := b.readBlock(ctx, off&^(bs-1)); err != nil {
			return err
		}
		copy(head, b.bounce[off%bs:])
	}
	at := off + uint64(len(head))
	if len(mid) > 0 {
		if err := full(b.backend.ReadAt(ctx, mid, int64(at))); err != nil {
			return err
		}
	}
	at += uint64(len(mid))
	if len(tail) > 0 {
		if err := b.readBlock(ctx, at); err != nil {
			return err
		}
		copy(tail, b.bounce)
	}
	return nil
}

// writeAt writes guest memory p at off: the aligned middle straight from
// p, unaligned edges by read-modify-write of the bounce block.
func (b *VirtioBlk) writeAt(ctx context.Context, p []byte, off uint64) error {
	head, mid, tail := b.split(p, off)
	bs := uint64(b.backend.BlockSize())
	if len(head) > 0 {
		blk := off &^ (bs - 1)
		if err := b.readBlock(ctx, blk); err != nil {
			return err
		}
		copy(b.bounce[off%bs:], head)
		if err := full(b.backend.WriteAt(ctx, b.bounce, int64(blk))); err != nil {
			return err
		}
	}
	at := off + uint64(len(head))
	if len(mid) > 0 {
		if err := full(b.backend.WriteAt(ctx, mid, int64(at))); err != nil {
			return err
		}
	}
	at += uint64(len(mid))
	if len(tail) > 0 {
		if err := b.readBlock(ctx, at); err != nil {
			return err
		}
		copy(b.bounce, tail)
		if err := full(b.backend.WriteAt(ctx, b.bounce, int64(at))); err != nil {
			return err
		}
	}
	return nil
}

// readBlock fills the bounce buffer with the block at off.
func (b *VirtioBlk) readBlock(ctx context.Context, off uint64) error {
	return full(b.backend.ReadAt(ctx, b.bounce, int64(off)))
}

// full returns a transfer's error: io.ReaderAt and io.WriterAt contracts
// make a short transfer an error, so the count needs no check.
func full(_ int, err error) error { return err }
