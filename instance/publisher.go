package instance

import (
	"context"
	"errors"
	"sync"

	"tern/instance/apiv1"
)

// ErrGone is returned once the publisher is closed: the instance is gone.
// The API maps it to 410.
var ErrGone = errors.New("instance gone")

// Publisher publishes an instance's views and lets any number of
// watchers long-poll for the next one. Publish, Current, WaitAfter and Close
// are safe to call from any goroutine.
type Publisher struct {
	mu sync.Mutex
	// cur is the latest view; its Gen only grows.
	cur apiv1.View
	// changed is closed, and replaced by a fresh channel, by every publish;
	// Close closes it and does not replace it. Waiters block on it.
	changed chan struct{}
	// gone is set by Close.
	gone bool
}

// NewPublisher returns a publisher whose first view, gen 1, has the
// given state and migration: (creating, none) for an instance ensured from
// a spec, (migrating, in={id, sync}) for a migration target.
func NewPublisher(state apiv1.State, mig apiv1.Migration) *Publisher {
	return NewPublisherAt(1, state, mig)
}

// NewPublisherAt is NewPublisher with a first gen other than 1 (at least
// 1): a process that hosts one instance after another starts each new
// publisher past the last one's final gen, so a watcher's gens strictly
// increase across instances too.
func NewPublisherAt(first apiv1.ViewGen, state apiv1.State, mig apiv1.Migration) *Publisher {
	return &Publisher{
		cur:     apiv1.View{Gen: max(first, 1), State: state, Migration: mig},
		changed: make(chan struct{}),
	}
}

// Publish applies update to a copy of the current view and publishes
// the result as the next generation, waking every waiter. All changes made
// by one update appear in one view, so a watcher never sees half of
// them (seed 001: migration.out.phase=error and state=running together).
// update runs under the publisher's lock: it must be quick and must not
// call the publisher. Its change to Gen, if any, is overwritten. After
// Close, Publish does nothing and returns ErrGone.
func (p *Publisher) Publish(update func(*apiv1.View)) (apiv1.View, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.gone {
		return apiv1.View{}, ErrGone
	}
	next := p.cur
	update(&next)
	next.Gen = p.cur.Gen + 1
	p.cur = next
	close(p.changed)
	p.changed = make(chan struct{})
	return next, nil
}

// Current returns the latest view, also after Close.
func (p *Publisher) Current() apiv1.View {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cur
}

// WaitAfter returns the latest view as soon as its gen is greater than
// gen: at once if it already is, otherwise when a publish makes it so. A
// watcher passes the gen it last saw and so never misses the latest state,
// though it may skip intermediate ones. It returns ErrGone once the
// publisher is closed and holds nothing newer than gen (a watcher that is
// behind still gets the final view first), and ctx.Err() if ctx ends
// first. It blocks on a channel, never polls.
func (p *Publisher) WaitAfter(ctx context.Context, gen apiv1.ViewGen) (apiv1.View, error) {
	for {
		p.mu.Lock()
		cur, changed, gone := p.cur, p.changed, p.gone
		p.mu.Unlock()
		switch {
		case cur.Gen > gen:
			return cur, nil
		case gone:
			return apiv1.View{}, ErrGone
		}
		select {
		case <-changed:
			// Something was published or the publisher closed; look again.
			// Each wake-up follows a publish, so this loop turns once per
			// generation at most.
		case <-ctx.Done():
			return apiv1.View{}, ctx.Err()
		}
	}
}

// Close marks the instance gone: waiters that are caught up return ErrGone,
// and Publish fails from now on. Current keeps answering with the last
// view. Close is idempotent.
func (p *Publisher) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.gone {
		return
	}
	p.gone = true
	close(p.changed)
}
