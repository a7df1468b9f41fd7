package ec

import "math/bits"

// stripeSet is a set of stripes, one bit each: a shard's blocks that may
// be wrong (it missed a write of them, failed their hash, or came back
// from a crash with their extent dirty). One bit per block of the shard's
// region: 32 KiB for a 1 GiB shard of 4 KiB blocks.
type stripeSet struct {
	words []uint64
	count uint64
}

func newStripeSet(n uint64) stripeSet { return stripeSet{words: make([]uint64, (n+63)/64)} }

func (s *stripeSet) has(i StripeIndex) bool { return s.words[i/64]&(1<<(i%64)) != 0 }

func (s *stripeSet) add(i StripeIndex) {
	if !s.has(i) {
		s.words[i/64] |= 1 << (i % 64)
		s.count++
	}
}

func (s *stripeSet) remove(i StripeIndex) {
	if s.has(i) {
		s.words[i/64] &^= 1 << (i % 64)
		s.count--
	}
}

func (s *stripeSet) addRange(first, last StripeIndex) {
	for i := first; i <= last; i++ {
		s.add(i)
	}
}

// next returns the first member at or after from, or false.
func (s *stripeSet) next(from StripeIndex) (StripeIndex, bool) {
	for w := from / 64; w < StripeIndex(len(s.words)); w++ {
		word := s.words[w]
		if w == from/64 {
			word &^= (1 << (from % 64)) - 1
		}
		if word != 0 {
			return w*64 + StripeIndex(bits.TrailingZeros64(word)), true
		}
	}
	return 0, false
}
