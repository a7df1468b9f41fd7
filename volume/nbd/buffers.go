package nbd

import (
	"math/bits"
	"sync"
)

// buffer is a pooled request payload of a power-of-two capacity.
type buffer struct {
	b     []byte
	class int
}

// minBufferShift is the smallest pooled size (4 KiB); requests of up to
// MaxRequestBytes use one of the classes above it.
const (
	minBufferShift = 12
	bufferClasses  = 26 - minBufferShift // 4 KiB … 32 MiB
)

var bufferPools [bufferClasses]sync.Pool

// getBuffer returns a buffer of n bytes (n ≤ MaxRequestBytes); its
// contents are not zeroed.
func getBuffer(n int) *buffer {
	class := 0
	if n > 1<<minBufferShift {
		class = bits.Len(uint(n-1)) - minBufferShift
	}
	if v := bufferPools[class].Get(); v != nil {
		b := v.(*buffer)
		b.b = b.b[:n]
		return b
	}
	return &buffer{b: make([]byte, n, 1<<(class+minBufferShift)), class: class}
}

// putBuffer returns b to its pool; b must not be used afterwards.
func putBuffer(b *buffer) {
	if b != nil {
		bufferPools[b.class].Put(b)
	}
}
