package downstairs

import (
	"math/bits"
	"sync"

	"tern/volume/wire"
)

// Buffer size classes: 4 KiB, 16 KiB, 64 KiB, 256 KiB, 1 MiB. A job takes
// the smallest class that holds its data, so a queue of small IOs does not
// pin megabytes.
const (
	minBufShift = 12
	maxBufShift = 20
	bufClasses  = (maxBufShift-minBufShift)/2 + 1
)

// bufPool hands out data buffers for jobs; the steady state allocates none.
type bufPool struct {
	classes [bufClasses]sync.Pool // each holds *[]byte of 1<<(minBufShift+2i) bytes
}

func bufClass(n int) int {
	if n <= 1<<minBufShift {
		return 0
	}
	shift := bits.Len(uint(n - 1)) // smallest power of two ≥ n
	return (shift - minBufShift + 1) / 2
}

// get returns a buffer of length n (n ≤ wire.MaxDataSize).
func (p *bufPool) get(n int) *[]byte {
	c := bufClass(n)
	if b, ok := p.classes[c].Get().(*[]byte); ok {
		*b = (*b)[:n]
		return b
	}
	b := make([]byte, n, 1<<(minBufShift+2*c))
	return &b
}

// put returns a buffer from get.
func (p *bufPool) put(b *[]byte) {
	if b == nil || cap(*b) > wire.MaxDataSize {
		return
	}
	p.classes[bufClass(cap(*b))].Put(b)
}
