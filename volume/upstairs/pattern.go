package upstairs

import (
	"bytes"
	"encoding/binary"
)

// FillPattern fills buf, which holds whole blocks of blockSize bytes
// starting at block first, with data derived only from seed and each
// block's index, so any block can be recomputed on its own (by `tern volume
// verify`, tests and benchmarks). Every block differs from every other and
// from the same block under another seed.
func FillPattern(buf []byte, blockSize int, first uint64, seed uint64) {
	for b := 0; b+blockSize <= len(buf); b += blockSize {
		fillBlock(buf[b:b+blockSize], first+uint64(b/blockSize), seed)
	}
}

// fillBlock writes a splitmix64 stream keyed by (seed, block).
func fillBlock(block []byte, index, seed uint64) {
	state := seed ^ (index * 0x9e3779b97f4a7c15) ^ 0xd1b54a32d192ed03
	i := 0
	for ; i+8 <= len(block); i += 8 {
		state += 0x9e3779b97f4a7c15
		z := state
		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
		z = (z ^ (z >> 27)) * 0x94d049bb133111eb
		z ^= z >> 31
		binary.LittleEndian.PutUint64(block[i:], z)
	}
	for ; i < len(block); i++ {
		block[i] = byte(state >> (8 * (i % 8)))
	}
}

// CheckPattern returns the index of the first block in buf (blocks of
// blockSize starting at block first) that differs from FillPattern's data,
// and false if all match. scratch, if at least blockSize long, avoids an
// allocation.
func CheckPattern(buf []byte, blockSize int, first uint64, seed uint64, scratch []byte) (uint64, bool) {
	if len(scratch) < blockSize {
		scratch = make([]byte, blockSize)
	}
	want := scratch[:blockSize]
	for b := 0; b+blockSize <= len(buf); b += blockSize {
		idx := first + uint64(b/blockSize)
		fillBlock(want, idx, seed)
		if !bytes.Equal(want, buf[b:b+blockSize]) {
			return idx, true
		}
	}
	return 0, false
}
