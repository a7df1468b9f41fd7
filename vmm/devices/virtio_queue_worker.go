package devices

import (
	"context"
	"errors"
	"fmt"
)

// Notifier delivers one queue's notifications to the goroutine that
// serves it: for a Linux guest, an eventfd KVM signals when the guest
// writes the queue's index to QueueNotify (an ioeventfd), so the write
// costs the vCPU no exit to user space.
type Notifier interface {
	// Read waits until the queue was notified at least once since the
	// last Read and returns how many times; after Close it returns an
	// error.
	Read() (uint64, error)
	// Close stops the notifications (deassigning an ioeventfd) and wakes
	// a Read in progress.
	Close() error
}

// Notifiers opens the Notifier of a transport's queues.
type Notifiers interface {
	// Notifier starts delivering queue q's notifications. A queue whose
	// Notifier fails is served synchronously, as without Notifiers.
	Notifier(q int) (Notifier, error)
}

// queueWorker is the goroutine serving one queue on the asynchronous path.
type queueWorker struct {
	// Immutable after startWorkers.
	n Notifier
	// stop is closed to end the worker; done is closed when it has.
	stop, done chan struct{}
}

// serve is queue q's worker: it makes one pass over the queue (serving
// what the driver made available before the worker existed: on a
// migration target, what the source was notified of but had not served),
// then one pass per wake-up of its Notifier, until stopped. Each pass
// holds run[q], which is what Quiesce and a reset wait for.
func (t *VirtioMMIO) serve(q int, w *queueWorker) {
	defer close(w.done)
	for {
		select {
		case t.run[q] <- struct{}{}:
		case <-w.stop:
			return
		}
		t.processQueue(q)
		<-t.run[q]
		if _, err := w.n.Read(); err != nil {
			return // closed by stopWorkers
		}
	}
}

// startWorkers gives every ready queue of a running device a worker, on
// the asynchronous path. The caller holds lifecycle.
func (t *VirtioMMIO) startWorkers() {
	if t.notifiers == nil {
		return
	}
	t.mu.Lock()
	var start []int
	if !t.closed && t.status&StatusDriverOK != 0 && t.status&StatusNeedsReset == 0 {
		for q := range t.queues {
			if t.queues[q].ready && t.workers[q] == nil {
				start = append(start, q)
			}
		}
	}
	t.mu.Unlock()
	for _, q := range start {
		n, err := t.notifiers.Notifier(q)
		if err != nil {
			continue // served synchronously (see Notifiers)
		}
		w := &queueWorker{n: n, stop: make(chan struct{}), done: make(chan struct{})}
		t.mu.Lock()
		t.workers[q] = w
		t.mu.Unlock()
		go t.serve(q, w)
	}
}

// stopWorkers stops the workers of queues qs and waits until they have
// returned, their request in flight finished. The caller holds lifecycle.
func (t *VirtioMMIO) stopWorkers(qs []int) error {
	t.mu.Lock()
	var ws []*queueWorker
	for _, q := range qs {
		if w := t.workers[q]; w != nil {
			ws = append(ws, w)
			t.workers[q] = nil
		}
	}
	t.mu.Unlock()
	var errs []error
	for _, w := range ws {
		close(w.stop)
		if err := w.n.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	for _, w := range ws {
		<-w.done
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("stopping virtio queue workers: %w", err)
	}
	return nil
}

// allQueues lists every queue index.
func (t *VirtioMMIO) allQueues() []int {
	qs := make([]int, len(t.run))
	for i := range qs {
		qs[i] = i
	}
	return qs
}

// holdQueues takes run[q] of each of qs, in order, waiting for a request
// in flight and for Resume; false when the device's context ended first
// (nothing is held then).
func (t *VirtioMMIO) holdQueues(qs []int) bool {
	for i, q := range qs {
		select {
		case t.run[q] <- struct{}{}:
		case <-t.ctx.Done():
			t.releaseQueues(qs[:i])
			return false
		}
	}
	return true
}

// releaseQueues gives back what holdQueues took.
func (t *VirtioMMIO) releaseQueues(qs []int) {
	for _, q := range qs {
		<-t.run[q]
	}
}

// Quiesce stops the transport at a request boundary: once it returns no
// request is in flight and none is processed, on either path, until
// Resume. Notifications that arrive meanwhile are not lost: they are
// served after Resume. State then captures rings that match guest memory
// exactly, which is what a live migration needs (package migration calls
// it after pausing the vCPUs, whose own notifications would otherwise
// wait in it). It fails only when ctx ends first, holding nothing then.
// Quiescing a quiesced transport does nothing.
func (t *VirtioMMIO) Quiesce(ctx context.Context) error {
	t.quiesce.Lock()
	defer t.quiesce.Unlock()
	if t.quiesced {
		return nil
	}
	for i := range t.run {
		select {
		case t.run[i] <- struct{}{}:
		case <-ctx.Done():
			t.releaseQueues(t.allQueues()[:i])
			return fmt.Errorf("quiescing virtio device: %w", ctx.Err())
		}
	}
	t.quiesced = true
	return nil
}

// Resume lets a quiesced transport process again; on a transport that is
// not quiesced it does nothing.
func (t *VirtioMMIO) Resume() {
	t.quiesce.Lock()
	defer t.quiesce.Unlock()
	if !t.quiesced {
		return
	}
	t.releaseQueues(t.allQueues())
	t.quiesced = false
}

// Close stops the queue workers (closing their Notifiers) and waits for
// them; no worker starts after it. The VM closes its transports after
// stopping its vCPUs and before closing the KVM VM its ioeventfds are
// registered in. Closing twice is a no-op.
func (t *VirtioMMIO) Close() error {
	t.lifecycle.Lock()
	defer t.lifecycle.Unlock()
	t.mu.Lock()
	t.closed = true
	t.mu.Unlock()
	return t.stopWorkers(t.allQueues())
}
