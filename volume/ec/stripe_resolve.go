package ec

import (
	"bytes"
	"errors"
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
