package httpjson

import (
	"context"
	"net/http"
	"strconv"
	"sync"
)

// AfterGen reads a long-poll's after_gen query parameter: the generation
// the client last saw, 0 when the parameter is absent. ok is false when
// it is present but not a generation.
func AfterGen(r *http.Request) (gen uint64, ok bool) {
	q := r.URL.Query().Get("after_gen")
	if q == "" {
		return 0, true
	}
	n, err := strconv.ParseUint(q, 10, 64)
	return n, err == nil
}

// Generation numbers the versions of a value a server publishes, and
// wakes the long-polls waiting for one newer than they saw. Its methods
// are safe to call from any goroutine.
type Generation struct {
	mu sync.Mutex
	// n only grows.
	n uint64
	// changed is closed, and replaced, by every Advance; waiters block
	// on it.
	changed chan struct{}
}

// NewGeneration returns a generation that starts at first.
func NewGeneration(first uint64) *Generation {
	return &Generation{n: first, changed: make(chan struct{})}
}

// Load returns the current generation.
func (g *Generation) Load() uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.n
}

// Advance counts one change, wakes every waiter, and returns the new
// generation.
func (g *Generation) Advance() uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.n++
	close(g.changed)
	g.changed = make(chan struct{})
	return g.n
}

// WaitAfter returns the generation as soon as it is greater than after
// (at once if it already is), or the generation then and false when ctx
// ends first. It blocks on a channel, never polls.
func (g *Generation) WaitAfter(ctx context.Context, after uint64) (uint64, bool) {
	for {
		g.mu.Lock()
		n, changed := g.n, g.changed
		g.mu.Unlock()
		if n > after {
			return n, true
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return g.Load(), false
		}
	}
}
