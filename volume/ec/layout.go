package ec

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"tern/volume/ids"
)

// Bounds of a layout: k data shards from MinData to MaxData, m parity
// shards from MinParity to MaxParity.
const (
	MinData   = 2
	MaxData   = 8
	MinParity = 1
	MaxParity = 3
)

// DefaultLayout is the layout `--layout ec` without numbers means: four
// data and two parity shards (half the storage of three replicas, two
// losses survived).
var DefaultLayout = Layout{Data: 4, Parity: 2}

// ErrInvalidLayout: a layout outside the bounds, or text that is not one.
var ErrInvalidLayout = errors.New("invalid erasure-coded layout")

// Layout is the shape of an erasure-coded volume: Data shards hold the
// client's blocks, Parity shards the Reed-Solomon parity of each stripe.
//
// A stripe is one block at the same offset on every shard. Client block b
// lives in stripe b / Data, on data shard b % Data, at block b / Data of
// that shard's region: consecutive client blocks go round the data
// shards, so Data consecutive, aligned blocks are one full stripe (a
// sequential write encodes without reading anything back). Shard i of
// the volume is target i: data shards first, then parity.
type Layout struct {
	Data   int
	Parity int
}

// Shards is the number of downstairs the layout needs.
func (l Layout) Shards() int { return l.Data + l.Parity }

// String is the layout as the CLI spells it, "ec:4+2".
func (l Layout) String() string { return fmt.Sprintf("ec:%d+%d", l.Data, l.Parity) }

// Validate reports a layout outside the bounds.
func (l Layout) Validate() error {
	var problems []string
	if l.Data < MinData || l.Data > MaxData {
		problems = append(problems, fmt.Sprintf("data shards %d: want %d to %d", l.Data, MinData, MaxData))
	}
	if l.Parity < MinParity || l.Parity > MaxParity {
		problems = append(problems, fmt.Sprintf("parity shards %d: want %d to %d", l.Parity, MinParity, MaxParity))
	}
	if len(problems) > 0 {
		return fmt.Errorf("%w: %s", ErrInvalidLayout, strings.Join(problems, "; "))
	}
	return nil
}

// ParseLayout reads "ec:K+M" (or "ec", the default 4+2) into a validated
// Layout.
func ParseLayout(s string) (Layout, error) {
	if s == "ec" {
		return DefaultLayout, nil
	}
	rest, ok := strings.CutPrefix(s, "ec:")
	if !ok {
		return Layout{}, fmt.Errorf("%w: %q: want ec:K+M, such as ec:4+2", ErrInvalidLayout, s)
	}
	ks, ms, ok := strings.Cut(rest, "+")
	k, kerr := strconv.Atoi(ks)
	m, merr := strconv.Atoi(ms)
	if !ok || kerr != nil || merr != nil {
		return Layout{}, fmt.Errorf("%w: %q: want ec:K+M with K and M numbers, such as ec:4+2", ErrInvalidLayout, s)
	}
	l := Layout{Data: k, Parity: m}
	if err := l.Validate(); err != nil {
		return Layout{}, fmt.Errorf("%q: %w", s, err)
	}
	return l, nil
}

// StripeIndex is the index of a stripe, which is also the block index of
// its blocks within every shard's region.
type StripeIndex = ids.BlockIndex

// Locate maps client block b to its stripe and data shard.
func (l Layout) Locate(b ids.BlockIndex) (stripe StripeIndex, shard int) {
	return b / ids.BlockIndex(l.Data), int(b % ids.BlockIndex(l.Data))
}

// Block is the client block held by data shard shard in stripe s.
func (l Layout) Block(s StripeIndex, shard int) ids.BlockIndex {
	return s*ids.BlockIndex(l.Data) + ids.BlockIndex(shard)
}

// VolumeBlocks is the client-visible block count over shards of
// shardBlocks blocks each.
func (l Layout) VolumeBlocks(shardBlocks uint64) uint64 { return shardBlocks * uint64(l.Data) }

// StripeSpan is the run of stripes a client range [first, first+count)
// touches, and for each end whether it covers the stripe fully.
type StripeSpan struct {
	First, Last StripeIndex // inclusive
}

// Span returns the stripes client blocks [first, first+count) touch;
// count must be positive.
func (l Layout) Span(first ids.BlockIndex, count uint64) StripeSpan {
	k := ids.BlockIndex(l.Data)
	return StripeSpan{First: first / k, Last: (first + ids.BlockIndex(count) - 1) / k}
}
