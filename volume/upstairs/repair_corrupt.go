package upstairs

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/cespare/xxhash/v2"

	"tern/volume/ids"
	"tern/volume/reconcile"
	"tern/volume/upstairs/engine"
	"tern/volume/wire"
)

// A replica that crashed mid-write comes back with its torn blocks marked
// corrupt (the extent layer's crash rule 4): it refuses to read them
// (wire.CodeCorruptBlock), reports them in ExtentHashes as differing from
// any peer, and keeps their extent dirty until they are rewritten. Such a
// replica is dirty and so often the activation's source. Its corrupt
// blocks are then taken from the other replicas, the plan's Donors in
// order (mendSource), and written to the source before the destinations
// are compared with it; a block no replica holds intact fails the repair
// with a *CorruptBlockError.

// CorruptBlockError reports a block a repair needed and could not read
// intact from any replica it asked: each refused it as corrupt or
// returned data that does not match its recorded hash. It wraps
// ErrCorrupt.
type CorruptBlockError struct {
	// Extent is the extent being repaired.
	Extent ids.ExtentID
	// Block is the block, counted from the extent's first block; the
	// first such block when there are several.
	Block uint32
	// Replicas lists the replicas asked for the block, in the order
	// asked; none had it intact.
	Replicas []int
}

// Error implements error.
func (e *CorruptBlockError) Error() string {
	return fmt.Sprintf("extent %d block %d: no intact copy on replicas %v", e.Extent, e.Block, e.Replicas)
}

// Unwrap returns ErrCorrupt.
func (e *CorruptBlockError) Unwrap() error { return ErrCorrupt }

// blockCopies holds blocks of one extent read intact: Blocks[i] has
// recorded hash Hashes[i] and data Data[i*blockSize:].
type blockCopies struct {
	blocks []uint32
	hashes []uint64
	data   []byte
}

// readIntact reads blocks (extent-relative, ascending) of extent e from
// replica r and returns, ascending, the ones that are not intact: refused
// as corrupt, or whose data does not hash to the hash recorded with it.
// With keep, the intact blocks are returned too (into got, in order).
//
// A batch refused as corrupt is halved until the refused blocks are
// found, so each costs a few reads more, never an unbounded number.
func (u *Upstairs) readIntact(ctx context.Context, r int, epoch uint64, e ids.ExtentID, blocks []uint32,
	keep bool, got *blockCopies) (bad []uint32, err error) {
	if len(blocks) == 0 {
		return nil, nil
	}
	bs := u.blockSize
	per := u.repairBatchBlocks()
	scratch := make([]byte, min(per, len(blocks))*bs)
	var visit func(b []uint32) error
	visit = func(b []uint32) error {
		for len(b) > per {
			if err := visit(b[:per]); err != nil {
				return err
			}
			b = b[per:]
		}
		buf := scratch[:len(b)*bs]
		call, err := u.startCall(r, epoch, &wire.RepairRead{Extent: e, Blocks: b}, buf)
		if err != nil {
			return fmt.Errorf("reading repair blocks from replica %d: %w", r, err)
		}
		m, err := u.waitCall(ctx, call)
		switch {
		case errors.Is(err, wire.CodeCorruptBlock) && len(b) == 1:
			bad = append(bad, b[0])
			return nil
		case errors.Is(err, wire.CodeCorruptBlock):
			if err := visit(b[:len(b)/2]); err != nil {
				return err
			}
			return visit(b[len(b)/2:])
		case err != nil:
			return fmt.Errorf("reading repair blocks from replica %d: %w", r, err)
		}
		data, ok := m.(*wire.RepairData)
		if !ok || data.Extent != e || !slices.Equal(data.Blocks, b) ||
			len(data.Hashes) != len(b) || len(data.Data) != len(b)*bs {
			return fmt.Errorf("replica %d answered a repair read of extent %d with %v: %w", r, e, m.Type(), errBadRepairReply)
		}
		for i, blk := range b {
			block := data.Data[i*bs : (i+1)*bs]
			switch {
			case xxhash.Sum64(block) != data.Hashes[i]:
				bad = append(bad, blk)
			case keep:
				got.blocks = append(got.blocks, blk)
				got.hashes = append(got.hashes, data.Hashes[i])
				got.data = append(got.data, block...)
			}
		}
		return nil
	}
	if err := visit(blocks); err != nil {
		return nil, err
	}
	return bad, nil
}

// mendSource replaces the corrupt blocks of rep's source. srcV is the
// source's version as it stands after its stamp; it is still dirty only
// if the source holds corrupt blocks (the extent layer never stamps those
// clean), so the caller calls this only then. Every block of the source
// is read to find them (hashes cannot: a block torn alike on every
// replica reports the same complemented hash everywhere). Each is taken
// from the first of rep.Donors holding it intact and written to the
// source; the last batch stamps rep.Target, which stays clean on disk
// only once no corrupt block remains. srcHashes, when not nil, is the
// source's hash list and is updated to the blocks written, so the
// destinations are then compared with what the source now holds. With
// zeroLost (a restart reconciliation) a block torn on every replica is
// zeroed rather than failing the repair: every replica lost it at once,
// the volume must not stall for it, and a live write of it is replayed.
func (u *Upstairs) mendSource(ctx context.Context, t *reconcile.Tracker, rep reconcile.ExtentRepair, epochs [engine.ReplicaCount]uint64,
	srcV wire.ExtentVersion, srcHashes []uint64, zeroLost bool) error {
	e := ids.ExtentID(rep.Extent)
	src := int(rep.Source)
	all := make([]uint32, u.region.ExtentBlocks)
	for i := range all {
		all[i] = uint32(i)
	}
	bad, err := u.readIntact(ctx, src, epochs[src], e, all, false, nil)
	if err != nil {
		return err
	}
	if len(bad) == 0 {
		return nil
	}
	u.log.Warn("activation repair: source has corrupt blocks; taking them from the other replicas",
		"extent", e, "replica", src, "blocks", len(bad), "donors", rep.Donors)
	interim := srcV
	interim.Dirty = true
	per := u.repairBatchBlocks()
	for len(bad) > 0 {
		n := min(per, len(bad))
		got, err := u.takeFromDonors(ctx, rep, epochs, bad[:n], zeroLost)
		if err != nil {
			return err
		}
		bad = bad[n:]
		v := interim
		if len(bad) == 0 {
			v = toWireVersion(rep.Target)
		}
		t.GrowTotals(0, uint64(n)*uint64(u.blockSize))
		req := &wire.RepairWrite{Extent: e, Version: v, Blocks: got.blocks, Hashes: got.hashes, Data: got.data}
		if err := u.stamp(ctx, src, epochs[src], req); err != nil {
			return err
		}
		u.countCopied(repairActivation, t, n)
		for i, b := range got.blocks {
			if srcHashes != nil {
				srcHashes[b] = got.hashes[i]
			}
		}
	}
	return nil
}

// takeFromDonors reads blocks (ascending) of rep's extent from rep.Donors,
// each block from the first donor holding it intact, and returns them in
// the order of blocks. It fails with a *CorruptBlockError if no donor has
// one of them.
func (u *Upstairs) takeFromDonors(ctx context.Context, rep reconcile.ExtentRepair, epochs [engine.ReplicaCount]uint64,
	blocks []uint32, zeroLost bool) (blockCopies, error) {
	e := ids.ExtentID(rep.Extent)
	asked := []int{int(rep.Source)}
	var got blockCopies
	need := blocks
	for _, d := range rep.Donors {
		if len(need) == 0 {
			break
		}
		asked = append(asked, int(d))
		var err error
		if need, err = u.readIntact(ctx, int(d), epochs[d], e, need, true, &got); err != nil {
			return blockCopies{}, err
		}
	}
	if len(need) > 0 && zeroLost {
		u.addZeroedBlocks(&got, e, need, asked)
		need = nil
	}
	if len(need) > 0 {
		return blockCopies{}, &CorruptBlockError{Extent: e, Block: need[0], Replicas: asked}
	}
	// Donors answered in turn; put the blocks back in ascending order.
	bs := u.blockSize
	order := make([]int, len(got.blocks))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return int(got.blocks[a]) - int(got.blocks[b]) })
	out := blockCopies{data: make([]byte, 0, len(got.data))}
	for _, i := range order {
		out.blocks = append(out.blocks, got.blocks[i])
		out.hashes = append(out.hashes, got.hashes[i])
		out.data = append(out.data, got.data[i*bs:(i+1)*bs]...)
	}
	return out, nil
}

// corruptSourceError explains a repair read that replica src refused as
// corrupt (err): it finds the refused blocks among batch and names the
// first in a *CorruptBlockError. If none is refused any more, err stands.
func (u *Upstairs) corruptSourceError(ctx context.Context, c extentCopy, batch []uint32, err error) error {
	bad, rerr := u.readIntact(ctx, c.src, c.srcEpoch, c.extent, batch, false, nil)
	if rerr != nil || len(bad) == 0 {
		return fmt.Errorf("reading repair blocks from replica %d: %w", c.src, err)
	}
	return fmt.Errorf("reading repair blocks from replica %d: %w", c.src,
		&CorruptBlockError{Extent: c.extent, Block: bad[0], Replicas: []int{c.src}})
}

// addZeroedBlocks adds zeroed copies of blocks (of extent e) to got: no
// replica asked holds them intact after every replica restarted, and the
// volume must not stall for them (a live write of them is replayed).
func (u *Upstairs) addZeroedBlocks(got *blockCopies, e ids.ExtentID, blocks []uint32, asked []int) {
	u.log.Error("blocks damaged on every replica by the restart are lost; zeroing them", "extent", e, "blocks", blocks, "replicas", asked)
	zero := make([]byte, u.blockSize)
	h := xxhash.Sum64(zero)
	for _, b := range blocks {
		got.blocks = append(got.blocks, b)
		got.hashes = append(got.hashes, h)
		got.data = append(got.data, zero...)
	}
}
