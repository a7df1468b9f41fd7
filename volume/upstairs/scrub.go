package upstairs

import (
	"context"
	"fmt"

	"tern/volume/upstairs/engine"
	"tern/volume/wire"
)

// ScrubReport is what Scrub did.
type ScrubReport struct {
	// Replicas lists the replicas whose every block was read and checked
	// (those Active when their turn came).
	Replicas []int
	// Blocks counts the blocks read.
	Blocks uint64
	// Rewritten counts the blocks rewritten from a peer's good copy on
	// a replica that served one failing its hash (read repair rewrites
	// every block of the read that found it: up to an extent).
	Rewritten uint64
}

// Scrub reads every block of every Active replica and checks it against
// its recorded hash, so that a bit flipped at rest is found before it is
// the only copy left (live repair cannot copy from a source whose block
// fails its hash). Each read is a guest-ordered read served first by the
// replica checked: a block that fails there is read from a peer and
// rewritten on it from that good copy, as any read does (never over a
// newer write). Guest IO goes on meanwhile. Scrub returns once the
// rewrites are applied (a flush follows, and every connected replica
// answered everything it was sent).
func (u *Upstairs) Scrub(ctx context.Context) (ScrubReport, error) {
	var rep ScrubReport
	u.mu.Lock()
	bs, size := int64(u.blockSize), int64(u.region.Blocks())*int64(u.blockSize)
	chunk := min(int64(wire.MaxDataSize), int64(u.region.ExtentBlocks)*bs)
	u.mu.Unlock()
	if bs == 0 {
		return rep, fmt.Errorf("scrubbing volume: %w", ErrNotActive)
	}
	before := u.stats.blocksRewritten.Load()
	buf := make([]byte, chunk)
	for r := range engine.ReplicaCount {
		u.mu.Lock()
		active := u.eng.State(r) == engine.ReplicaActive
		u.mu.Unlock()
		if !active {
			continue
		}
		for off := int64(0); off < size; off += chunk {
			p := buf[:min(chunk, size-off)]
			if err := u.doOn(ctx, engine.KindRead, p, off, false, r); err != nil {
				return rep, fmt.Errorf("scrubbing replica %d at %d: %w", r, off, err)
			}
			rep.Blocks += uint64(int64(len(p)) / bs)
		}
		rep.Replicas = append(rep.Replicas, r)
	}
	if err := u.Deactivate(ctx); err != nil {
		return rep, fmt.Errorf("scrubbing volume: %w", err)
	}
	rep.Rewritten = u.stats.blocksRewritten.Load() - before
	return rep, nil
}
