package devices

import (
	"errors"
	"sync"
)

// ErrOffsetAhead reports a read from past the end of the history.
var ErrOffsetAhead = errors.New("offset past the end of the history")

// History is a bounded byte history with absolute offsets: byte n of
// everything ever written keeps offset n, and only the newest capacity
// bytes are retained. Writers never block on readers; subscribers are
// woken through one-slot channels and read what they missed with
// ReadFrom.
type History struct {
	// Immutable after construction.
	capacity int

	mu sync.Mutex
	// ring holds the retained bytes; byte at absolute offset o is at
	// ring[o % capacity].
	ring []byte
	// end is the absolute offset one past the newest byte.
	end uint64
	// subs are woken after every write.
	subs map[*Subscription]struct{}
}

// NewHistory returns an empty history retaining capacity bytes.
func NewHistory(capacity int) *History {
	if capacity <= 0 {
		capacity = 1
	}
	return &History{capacity: capacity, ring: make([]byte, capacity), subs: map[*Subscription]struct{}{}}
}

// Write appends p, dropping the oldest bytes beyond the capacity, and wakes
// every subscriber without blocking. It never fails.
func (h *History) Write(p []byte) (int, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := len(p)
	if len(p) > h.capacity {
		h.end += uint64(len(p) - h.capacity)
		p = p[len(p)-h.capacity:]
	}
	for len(p) > 0 {
		i := int(h.end % uint64(h.capacity))
		c := copy(h.ring[i:], p)
		p = p[c:]
		h.end += uint64(c)
	}
	for s := range h.subs {
		select {
		case s.notify <- struct{}{}:
		default: // already pending: the subscriber will read everything
		}
	}
	return n, nil
}

// Bounds returns the oldest retained offset and the end offset.
func (h *History) Bounds() (start, end uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.startLocked(), h.end
}

func (h *History) startLocked() uint64 {
	if h.end > uint64(h.capacity) {
		return h.end - uint64(h.capacity)
	}
	return 0
}

// ReadFrom returns up to max bytes starting at offset, and the offset of
// the first returned byte: later than offset when those bytes were
// dropped. next is the offset to read from next.
func (h *History) ReadFrom(offset uint64, max int) (data []byte, first, next uint64, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if offset > h.end {
		return nil, 0, 0, ErrOffsetAhead
	}
	first = offset
	if s := h.startLocked(); first < s {
		first = s
	}
	n := min(uint64(max), h.end-first)
	data = make([]byte, n)
	for i := uint64(0); i < n; {
		at := int((first + i) % uint64(h.capacity))
		i += uint64(copy(data[i:], h.ring[at:min(len(h.ring), at+int(n-i))]))
	}
	return data, first, first + n, nil
}

// Subscription wakes a reader after writes to a History.
type Subscription struct {
	h      *History
	notify chan struct{}
}

// Subscribe registers a new subscriber.
func (h *History) Subscribe() *Subscription {
	s := &Subscription{h: h, notify: make(chan struct{}, 1)}
	h.mu.Lock()
	h.subs[s] = struct{}{}
	h.mu.Unlock()
	return s
}

// C receives a value after one or more writes since the last receive.
func (s *Subscription) C() <-chan struct{} { return s.notify }

// Close unregisters the subscriber.
func (s *Subscription) Close() {
	s.h.mu.Lock()
	delete(s.h.subs, s)
	s.h.mu.Unlock()
}
