package ec

import (
	"errors"
	"fmt"

	"github.com/klauspost/reedsolomon"
)

// ErrTooFewShards: fewer than Data blocks of a stripe are intact, so it
// can neither be reconstructed nor written.
var ErrTooFewShards = errors.New("fewer intact shards than data shards")

// Codec computes and checks one layout's parity: a reedsolomon.Encoder
// and the layout it was made for. Safe for concurrent use (the encoder
// is).
type Codec struct {
	Layout Layout
	enc    reedsolomon.Encoder
}

// NewCodec returns the codec of a valid layout.
func NewCodec(l Layout) (*Codec, error) {
	if err := l.Validate(); err != nil {
		return nil, err
	}
	enc, err := reedsolomon.New(l.Data, l.Parity)
	if err != nil {
		return nil, fmt.Errorf("creating %v codec: %w", l, err)
	}
	return &Codec{Layout: l, enc: enc}, nil
}

// Encode fills the parity blocks of stripe (Shards() blocks of one size;
// the data blocks set) from its data blocks.
func (c *Codec) Encode(stripe [][]byte) error {
	if err := c.enc.Encode(stripe); err != nil {
		return fmt.Errorf("encoding stripe: %w", err)
	}
	return nil
}

// ReconstructData fills the nil data blocks of stripe from any Data of
// its non-nil blocks (parity blocks stay as they are). Each filled slice
// is newly allocated or taken from its capacity.
func (c *Codec) ReconstructData(stripe [][]byte) error {
	if present(stripe) < c.Layout.Data {
		return ErrTooFewShards
	}
	if err := c.enc.ReconstructData(stripe); err != nil {
		return fmt.Errorf("reconstructing stripe data: %w", err)
	}
	return nil
}

// Reconstruct fills every nil block of stripe, data and parity.
func (c *Codec) Reconstruct(stripe [][]byte) error {
	if present(stripe) < c.Layout.Data {
		return ErrTooFewShards
	}
	if err := c.enc.Reconstruct(stripe); err != nil {
		return fmt.Errorf("reconstructing stripe: %w", err)
	}
	return nil
}

func present(stripe [][]byte) int {
	n := 0
	for _, b := range stripe {
		if len(b) > 0 {
			n++
		}
	}
	return n
}
