package ec

import (
	"bytes"
	"errors"

	"github.com/cespare/xxhash/v2"
)

// ErrInconsistentStripe: the trusted blocks of a stripe disagree and no
// single block can be blamed, while a data block is missing, so the
// stripe's content cannot be decided.
var ErrInconsistentStripe = errors.New("stripe blocks disagree and cannot be resolved")

// How a Resolution decided the stripe's content.
type Decision int

// Decisions of Resolve.
const (
	// Consistent: the trusted blocks agreed; missing and suspect ones
	// were reconstructed from them.
	Consistent Decision = iota
	// Outlier: exactly one trusted block disagreed with the others,
	// which agreed once it was left out.
	Outlier
	// ParityRecomputed: the trusted blocks disagreed with no one block to
	// blame (one parity shard, or two blocks off); every data block was
	// trusted, so the data decides and the parity is recomputed, as
	// a RAID resync does.
	ParityRecomputed
	// Settled: the blocks disagreed with a data block missing (the write
	// hole); Settle chose the decoding that rebuilds the missing blocks
	// to their recorded hashes.
	Settled
)

// Resolution is what one stripe should hold.
type Resolution struct {
	// Stripe holds every shard's correct block.
	Stripe [][]byte
	// Differs[i] is true where shard i's block (nil: not read or failing
	// its hash) is not Stripe[i]: it must be rewritten.
	Differs []bool
	How     Decision
}

// Resolve decides what a stripe should hold from the blocks read of it.
// blocks[i] is shard i's block, nil where it was unreadable (shard
// unreachable, block failing its hash); suspect[i] marks a shard known to
// be behind (it missed writes, was replaced, or reports an older extent
// version): its block is compared but never trusted. At least Data
// trusted blocks are needed. Resolve is pure; it allocates the blocks
// it reconstructs and never changes blocks.
func (c *Codec) Resolve(blocks [][]byte, suspect []bool) (Resolution, error) {
	n := c.Layout.Shards()
	if len(blocks) != n || len(suspect) != n {
		return Resolution{}, errors.New("resolving stripe: wrong number of shards")
	}
	trusted := make([]bool, n)
	count := 0
	for i, b := range blocks {
		if b != nil && !suspect[i] {
			trusted[i] = true
			count++
		}
	}
	if count < c.Layout.Data {
		return Resolution{}, ErrTooFewShards
	}
	how := Consistent
	stripe, ok := c.fromTrusted(blocks, trusted)
	if !ok {
		stripe, how = c.blameOne(blocks, trusted)
		if stripe == nil {
			stripe, how = c.fromData(blocks, trusted), ParityRecomputed
			if stripe == nil {
				return Resolution{}, ErrInconsistentStripe
			}
		}
	}
	res := Resolution{Stripe: stripe, Differs: make([]bool, n), How: how}
	for i, b := range blocks {
		res.Differs[i] = b == nil || !bytes.Equal(b, stripe[i])
	}
	return res, nil
}

// fromTrusted reconstructs the stripe from the first Data trusted blocks
// and reports whether every other trusted block agrees with it.
func (c *Codec) fromTrusted(blocks [][]byte, trusted []bool) ([][]byte, bool) {
	n := c.Layout.Shards()
	stripe := make([][]byte, n)
	used := 0
	for i := range n {
		if trusted[i] && used < c.Layout.Data {
			stripe[i] = blocks[i]
			used++
		}
	}
	if used < c.Layout.Data || c.Reconstruct(stripe) != nil {
		return nil, false
	}
	for i := range n {
		if trusted[i] && !bytes.Equal(stripe[i], blocks[i]) {
			return stripe, false
		}
	}
	return stripe, true
}

// blameOne finds the one trusted block whose omission makes the rest
// agree; nil when none or several do.
func (c *Codec) blameOne(blocks [][]byte, trusted []bool) ([][]byte, Decision) {
	var found [][]byte
	for j := range trusted {
		if !trusted[j] {
			continue
		}
		rest := append([]bool(nil), trusted...)
		rest[j] = false
		s, ok := c.fromTrusted(blocks, rest)
		if !ok {
			continue
		}
		if found != nil {
			return nil, Outlier // ambiguous
		}
		found = s
	}
	return found, Outlier
}

// fromData recomputes parity from the data blocks when every one is
// trusted; nil otherwise.
func (c *Codec) fromData(blocks [][]byte, trusted []bool) [][]byte {
	n, k := c.Layout.Shards(), c.Layout.Data
	stripe := make([][]byte, n)
	size := 0
	for i := range k {
		if !trusted[i] {
			return nil
		}
		stripe[i] = blocks[i]
		size = len(blocks[i])
	}
	for i := k; i < n; i++ {
		stripe[i] = make([]byte, size)
	}
	if c.Encode(stripe) != nil {
		return nil
	}
	return stripe
}

// Settle decides a stripe Resolve cannot: its present blocks disagree
// with no single one to blame while a data block is missing, the write
// hole a crash of every shard in the middle of a partial-stripe write
// leaves (one shard's block torn, the others holding old or new blocks).
// Every choice of Data present blocks decodes to a candidate stripe;
// recorded[i] is shard i's recorded hash of its block where known
// (known[i]), and a candidate that rebuilds a missing block to its
// recorded hash is one some write produced. The candidate with most such
// matches wins, then the one most present blocks agree with, then the
// first. When no candidate matches, the missing block's last write was
// torn and its recorded hash is that write's: the decoding of the
// blocks that survive is what the stripe held before it (with Data+1 or
// more present, the one most of them agree with). ErrTooFewShards when
// fewer than Data blocks are present. Settle is pure.
func (c *Codec) Settle(blocks [][]byte, recorded []uint64, known []bool) (Resolution, error) {
	n, k := c.Layout.Shards(), c.Layout.Data
	if len(blocks) != n || len(recorded) != n || len(known) != n {
		return Resolution{}, errors.New("settling stripe: wrong number of shards")
	}
	var present []int
	for i, b := range blocks {
		if b != nil {
			present = append(present, i)
		}
	}
	if len(present) < k {
		return Resolution{}, ErrTooFewShards
	}
	var (
		best                 [][]byte
		bestMatch, bestAgree = -1, -1
	)
	pick := make([]int, k)
	var walk func(from, depth int)
	walk = func(from, depth int) {
		if depth == k {
			stripe := make([][]byte, n)
			for _, i := range pick {
				stripe[i] = blocks[i]
			}
			if c.Reconstruct(stripe) != nil {
				return
			}
			match, agree := 0, 0
			for i, b := range blocks {
				switch {
				case b != nil && bytes.Equal(b, stripe[i]):
					agree++
				case b == nil && known[i] && holdsRecorded(stripe[i], recorded[i]):
					match++
				}
			}
			if match > bestMatch || match == bestMatch && agree > bestAgree {
				best, bestMatch, bestAgree = stripe, match, agree
			}
			return
		}
		for j := from; j <= len(present)-(k-depth); j++ {
			pick[depth] = present[j]
			walk(j+1, depth+1)
		}
	}
	walk(0, 0)
	if best == nil {
		return Resolution{}, ErrInconsistentStripe
	}
	res := Resolution{Stripe: best, Differs: make([]bool, n), How: Settled}
	for i, b := range blocks {
		res.Differs[i] = b == nil || !bytes.Equal(b, best[i])
	}
	return res, nil
}

// holdsRecorded reports whether b is the block a shard recorded hash h
// for (0 is a block never written, which reads as zeros).
func holdsRecorded(b []byte, h uint64) bool {
	if h == 0 {
		return allZero(b)
	}
	return xxhash.Sum64(b) == h
}
