package upstairs

import (
	"math/bits"

	"github.com/cespare/xxhash/v2"

	"tern/volume/ids"
	"tern/volume/wire"
)

// ioRecord is the driver's half of a job: where its data lives and who
// waits for it. Records are pooled and guarded by Upstairs.mu.
type ioRecord struct {
	// data is the job's bulk data: the caller's buffer until a write is
	// privatized, then priv.data.
	data []byte
	// hashes are the per-block hashes sent with a write: in the waiter
	// until the write is privatized, then priv.hashes. Like data, the
	// waiter's hashes are the caller's: they are reused by its next IO
	// once it returns, so a replica sends them only while the job still
	// holds the caller (job.callerMem, never while privatizing).
	hashes []uint64
	priv   *privBuf
	// waiter is told when the job completes; nil for jobs nobody waits for.
	waiter *waiter
	start  ids.BlockIndex
}

// privBuf is a private copy of a write's data and its hashes, shared by a
// torn write and its rewrite.
type privBuf struct {
	data   []byte
	hashes []uint64
	refs   int
	class  int
}

// waiter is one caller's wait for its jobs (a large IO is several jobs).
type waiter struct {
	ch      chan struct{} // one token when pending reaches zero
	pending int
	err     error
	ids     []wire.JobID
	hashes  []uint64 // per-block hashes of a write, computed before submission
	// background: a flush the upstairs issues itself after a repair,
	// which does not wait for room: jobs held for the repaired replica
	// wait for it (creditRepaired), so it must not wait for them.
	background bool
	// scrub is 1 + the replica whose copy a scrub read checks (0: none).
	scrub int
}

// bufClasses are the private-copy size classes: powers of two from 512 B to
// wire.MaxDataSize.
const (
	minBufShift = 9
	bufClasses  = 21 - minBufShift
)

// pools holds the driver's free lists; guarded by Upstairs.mu.
type pools struct {
	records []*ioRecord
	bufs    [bufClasses][]*privBuf
}

func (p *pools) record() *ioRecord {
	if n := len(p.records); n > 0 {
		r := p.records[n-1]
		p.records = p.records[:n-1]
		return r
	}
	return new(ioRecord)
}

func (p *pools) putRecord(r *ioRecord) {
	if r.priv != nil {
		p.unref(r.priv)
	}
	*r = ioRecord{}
	p.records = append(p.records, r)
}

func classOf(n int) int {
	if n <= 1<<minBufShift {
		return 0
	}
	return bits.Len(uint(n-1)) - minBufShift
}

// buf returns a private buffer of n bytes with room for blocks hashes.
func (p *pools) buf(n, blocks int) *privBuf {
	c := classOf(n)
	var b *privBuf
	if c < bufClasses {
		if k := len(p.bufs[c]); k > 0 {
			b = p.bufs[c][k-1]
			p.bufs[c] = p.bufs[c][:k-1]
		}
	}
	if b == nil {
		b = &privBuf{data: make([]byte, 1<<(c+minBufShift)), class: c}
	}
	b.data = b.data[:n]
	if cap(b.hashes) < blocks {
		b.hashes = make([]uint64, blocks)
	}
	b.hashes = b.hashes[:blocks]
	b.refs = 1
	return b
}

func (p *pools) unref(b *privBuf) {
	b.refs--
	if b.refs == 0 && b.class < bufClasses {
		p.bufs[b.class] = append(p.bufs[b.class], b)
	}
}

// hashBlocks fills dst[i] with the xxhash64 of block i of data.
func hashBlocks(dst []uint64, data []byte, blockSize int) {
	for i := range dst {
		dst[i] = xxhash.Sum64(data[i*blockSize : (i+1)*blockSize])
	}
}

// blockMatches reports whether a block read back matches the hash the
// downstairs recorded; a block never written has hash zero and zero data.
func blockMatches(block []byte, hash uint64) bool {
	if xxhash.Sum64(block) == hash {
		return true
	}
	if hash != 0 {
		return false
	}
	for _, b := range block {
		if b != 0 {
			return false
		}
	}
	return true
}
