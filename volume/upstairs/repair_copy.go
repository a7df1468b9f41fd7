package upstairs

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"tern/volume/ids"
	"tern/volume/reconcile"
	"tern/volume/wire"
)

// errBadRepairReply: a replica answered a repair request with something
// that does not match it. The repair stops; nothing is trusted.
var errBadRepairReply = errors.New("unexpected repair reply")

// copyDepth is how many repair reads, and separately how many repair
// writes, one extent copy keeps in flight: enough to overlap the source's
// reads, the wire and the destination's writes.
const copyDepth = 4

// extentCopy is the copy of some blocks of one extent from a source
// replica to a destination replica, over their sessions.
type extentCopy struct {
	kind     repairKind
	extent   ids.ExtentID
	src, dst int
	// srcEpoch and dstEpoch pin the calls to the sessions the repair
	// planned with (0: any session).
	srcEpoch, dstEpoch uint64
	// blocks lists the extent-relative blocks to copy, ascending.
	blocks []uint32
	// interim is the destination's version while the copy is partial: its
	// own version, dirty, so that until final is stamped it is planned
	// again and never wins over the source.
	interim wire.ExtentVersion
	// final is stamped on the destination with the last blocks, once every
	// earlier batch is durable there.
	final   wire.ExtentVersion
	tracker *reconcile.Tracker
}

// copyExtent copies c.blocks in batches that fit a frame, reading ahead
// from the source while the destination writes. The destination takes
// c.final only after every block is in place, so an interrupted copy
// leaves it at c.interim (dirty) and a retry redoes it.
func (u *Upstairs) copyExtent(ctx context.Context, c extentCopy) (err error) {
	bs := u.blockSize
	per := u.repairBatchBlocks()
	var batches [][]uint32
	for b := c.blocks; len(b) > 0; {
		n := min(per, len(b))
		batches = append(batches, b[:n])
		b = b[n:]
	}
	if len(batches) == 0 {
		return u.repairWrite(ctx, c, nil, nil, nil, c.final)
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type started struct {
		call  *call
		batch []uint32
		buf   []byte
	}
	var reads, writes []started
	var free [][]byte
	defer func() {
		// On failure, calls still out are abandoned; an interim write
		// that lands anyway only leaves the destination dirty.
		for _, s := range append(reads, writes...) {
			u.abandonCall(s.call)
		}
	}()
	ackWrite := func(s started) error {
		m, err := u.waitCall(ctx, s.call)
		if err != nil {
			return fmt.Errorf("writing repair blocks to replica %d: %w", c.dst, err)
		}
		if _, ok := m.(*wire.Ack); !ok {
			return fmt.Errorf("replica %d answered a repair write with %v: %w", c.dst, m.Type(), errBadRepairReply)
		}
		u.countCopied(c.kind, c.tracker, len(s.batch))
		free = append(free, s.buf)
		return nil
	}
	next := 0
	for i := range batches {
		for ; next < len(batches) && len(reads) < copyDepth; next++ {
			var buf []byte
			if n := len(free); n > 0 {
				buf, free = free[n-1], free[:n-1]
			} else {
				buf = make([]byte, per*bs)
			}
			b := batches[next]
			call, err := u.startCall(c.src, c.srcEpoch, &wire.RepairRead{Extent: c.extent, Blocks: b}, buf[:len(b)*bs])
			if err != nil {
				return fmt.Errorf("reading repair blocks from replica %d: %w", c.src, err)
			}
			reads = append(reads, started{call: call, batch: b, buf: buf})
		}
		rd := reads[0]
		reads = reads[1:]
		m, err := u.waitCall(ctx, rd.call)
		if errors.Is(err, wire.CodeCorruptBlock) {
			// The source refuses a block as torn. Activation mends a
			// source's corrupt blocks before copying (mendSource), and
			// an Active replica should hold none: name the block and
			// give up this attempt rather than retry the read.
			return u.corruptSourceError(ctx, c, rd.batch, err)
		}
		if err != nil {
			return fmt.Errorf("reading repair blocks from replica %d: %w", c.src, err)
		}
		data, ok := m.(*wire.RepairData)
		if !ok || data.Extent != c.extent || !slices.Equal(data.Blocks, rd.batch) ||
			len(data.Hashes) != len(rd.batch) || len(data.Data) != len(rd.batch)*bs {
			return fmt.Errorf("replica %d answered a repair read of extent %d with %v: %w", c.src, c.extent, m.Type(), errBadRepairReply)
		}
		if i == len(batches)-1 {
			// The final version goes with the last blocks, after every
			// earlier batch is durable on the destination.
			for len(writes) > 0 {
				s := writes[0]
				writes = writes[1:]
				if err := ackWrite(s); err != nil {
					return err
				}
			}
			if err := u.repairWrite(ctx, c, rd.batch, data.Hashes, data.Data, c.final); err != nil {
				return err
			}
			u.countCopied(c.kind, c.tracker, len(rd.batch))
			return nil
		}
		req := &wire.RepairWrite{Extent: c.extent, Version: c.interim, Blocks: rd.batch, Hashes: data.Hashes, Data: data.Data}
		call, err := u.startCall(c.dst, c.dstEpoch, req, nil)
		if err != nil {
			return fmt.Errorf("writing repair blocks to replica %d: %w", c.dst, err)
		}
		writes = append(writes, started{call: call, batch: rd.batch, buf: rd.buf})
		for len(writes) > copyDepth {
			s := writes[0]
			writes = writes[1:]
			if err := ackWrite(s); err != nil {
				return err
			}
		}
	}
	return nil
}

// repairWrite writes blocks (possibly none) to c.dst and sets its extent
// version to v, waiting for the acknowledgement.
func (u *Upstairs) repairWrite(ctx context.Context, c extentCopy, blocks []uint32, hashes []uint64, data []byte, v wire.ExtentVersion) error {
	req := &wire.RepairWrite{Extent: c.extent, Version: v, Blocks: blocks, Hashes: hashes, Data: data}
	return u.stamp(ctx, c.dst, c.dstEpoch, req)
}

// stamp sends a RepairWrite to replica r and waits for its Ack.
func (u *Upstairs) stamp(ctx context.Context, r int, epoch uint64, req *wire.RepairWrite) error {
	call, err := u.startCall(r, epoch, req, nil)
	if err != nil {
		return fmt.Errorf("writing extent %d repair to replica %d: %w", req.Extent, r, err)
	}
	m, err := u.waitCall(ctx, call)
	if err != nil {
		return fmt.Errorf("writing extent %d repair to replica %d: %w", req.Extent, r, err)
	}
	if _, ok := m.(*wire.Ack); !ok {
		return fmt.Errorf("replica %d answered a repair write with %v: %w", r, m.Type(), errBadRepairReply)
	}
	return nil
}

// extentHashes asks replica r for extent e's version and block hashes.
func (u *Upstairs) extentHashes(ctx context.Context, r int, epoch uint64, e ids.ExtentID) (*wire.ExtentHashes, error) {
	call, err := u.startCall(r, epoch, &wire.ExtentHashesRequest{Extent: e}, nil)
	if err != nil {
		return nil, fmt.Errorf("asking replica %d for extent %d hashes: %w", r, e, err)
	}
	m, err := u.waitCall(ctx, call)
	if err != nil {
		return nil, fmt.Errorf("asking replica %d for extent %d hashes: %w", r, e, err)
	}
	h, ok := m.(*wire.ExtentHashes)
	if !ok || h.Extent != e || len(h.Hashes) != int(u.region.ExtentBlocks) {
		return nil, fmt.Errorf("replica %d answered extent %d hashes with %v: %w", r, e, m.Type(), errBadRepairReply)
	}
	return h, nil
}

// extentVersion asks replica r for extent e's version.
func (u *Upstairs) extentVersion(ctx context.Context, r int, epoch uint64, e ids.ExtentID) (wire.ExtentVersion, error) {
	call, err := u.startCall(r, epoch, &wire.ExtentVersionsRequest{First: e, Count: 1}, nil)
	if err != nil {
		return wire.ExtentVersion{}, fmt.Errorf("asking replica %d for extent %d version: %w", r, e, err)
	}
	m, err := u.waitCall(ctx, call)
	if err != nil {
		return wire.ExtentVersion{}, fmt.Errorf("asking replica %d for extent %d version: %w", r, e, err)
	}
	v, ok := m.(*wire.ExtentVersions)
	if !ok || v.First != e || len(v.Versions) == 0 {
		return wire.ExtentVersion{}, fmt.Errorf("replica %d answered extent %d version with %v: %w", r, e, m.Type(), errBadRepairReply)
	}
	return v.Versions[0], nil
}

// blocksToCopy returns the blocks of an extent a repair copies: those
// whose hashes differ, or every block in whole-extent mode (srcHashes and
// dstHashes unused then).
func (u *Upstairs) blocksToCopy(srcHashes, dstHashes []uint64, t *reconcile.Tracker) ([]uint32, error) {
	if u.cfg.RepairWholeExtents {
		all := make([]uint32, u.region.ExtentBlocks)
		for i := range all {
			all[i] = uint32(i)
		}
		return all, nil
	}
	diff, err := reconcile.DiffBlocks(srcHashes, dstHashes)
	if err != nil {
		return nil, err
	}
	t.AddCompared(uint64(len(dstHashes)))
	u.stats.blocksCompared.Add(uint64(len(dstHashes)))
	blocks := make([]uint32, len(diff))
	for i, b := range diff {
		blocks[i] = uint32(b)
	}
	return blocks, nil
}

// repairBatchBlocks is how many blocks one repair read or write carries:
// as many as fit a frame.
func (u *Upstairs) repairBatchBlocks() int {
	return max(1, min(wire.MaxRepairBlocks, wire.MaxDataSize/u.blockSize))
}

// countCopied records n blocks written to a replica by a repair of kind
// k, on its tracker t.
func (u *Upstairs) countCopied(k repairKind, t *reconcile.Tracker, n int) {
	bytes := uint64(n) * uint64(u.blockSize)
	t.AddBytes(bytes)
	u.stats.blocksCopied.Add(uint64(n))
	u.stats.bytesCopied.Add(bytes)
	u.rmet.kinds[k].bytes.Add(int(bytes))
}

func toWireVersion(v reconcile.Version) wire.ExtentVersion {
	return wire.ExtentVersion{Gen: v.Gen, Flush: v.Flush, Dirty: v.Dirty}
}

func fromWireVersion(v wire.ExtentVersion) reconcile.Version {
	return reconcile.Version{Gen: v.Gen, Flush: v.Flush, Dirty: v.Dirty}
}
