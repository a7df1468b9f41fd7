package ec

import (
	"context"
	"sync"
)

// stripeLocks orders IO on overlapping stripes: a write (or a repair of a
// stripe) holds its stripes exclusively, a read shares them. Requests are
// granted in arrival order among those that overlap: a request waits for
// every earlier overlapping one that conflicts with it, granted or still
// waiting, so a read issued after a write sees it and nothing starves.
// Requests on disjoint stripes never wait for each other.
type stripeLocks struct {
	mu    sync.Mutex
	queue []*stripeLock // granted and waiting, in arrival order
}

// stripeLock is one request for stripes [first, last].
type stripeLock struct {
	first, last StripeIndex
	exclusive   bool
	granted     bool
	ready       chan struct{} // closed when granted
}

func (a *stripeLock) conflicts(b *stripeLock) bool {
	return (a.exclusive || b.exclusive) && a.first <= b.last && b.first <= a.last
}

// lock waits until stripes [first, last] are granted; the returned
// function releases them. If ctx ends first, the request is withdrawn.
func (t *stripeLocks) lock(ctx context.Context, first, last StripeIndex, exclusive bool) (func(), error) {
	l := &stripeLock{first: first, last: last, exclusive: exclusive, ready: make(chan struct{})}
	t.mu.Lock()
	t.queue = append(t.queue, l)
	t.grantLocked()
	t.mu.Unlock()
	select {
	case <-l.ready:
	case <-ctx.Done():
		t.release(l)
		return nil, ctx.Err()
	}
	return func() { t.release(l) }, nil
}

func (t *stripeLocks) release(l *stripeLock) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i, q := range t.queue {
		if q == l {
			t.queue = append(t.queue[:i], t.queue[i+1:]...)
			break
		}
	}
	t.grantLocked()
}

// grantLocked grants every waiting request no earlier one conflicts with.
func (t *stripeLocks) grantLocked() {
	for i, l := range t.queue {
		if l.granted {
			continue
		}
		free := true
		for _, e := range t.queue[:i] {
			if e.conflicts(l) {
				free = false
				break
			}
		}
		if free {
			l.granted = true
			close(l.ready)
		}
	}
}
