package devices

import "errors"

// ErrQueueNotRunning is Deliver's answer while the driver has not set
// DRIVER_OK, the device needs a reset, or the queue is not ready: the
// device holds what it has until the driver notifies the queue again. It
// is also the answer once the transport's context has ended.
var ErrQueueNotRunning = errors.New("virtqueue not running")

// Deliver lets a device push used entries to queue q from its own
// goroutine (virtio-net's receive side, fed by its backend rather than by
// the driver's notifications). fill runs holding the queue as a request
// does (run[q]): after any request in flight, never during a reset of the
// queue or while the transport is quiesced (Deliver waits for Resume, or
// for the transport's context to end), with the Virtqueue as the driver
// configured it. When fill reports it used a chain, the used-buffer bit
// is set and the interrupt raised. fill must not block.
func (t *VirtioMMIO) Deliver(q int, fill func(vq *Virtqueue, features uint64) (used bool)) error {
	if q < 0 || q >= len(t.run) || !t.holdQueues([]int{q}) {
		return ErrQueueNotRunning
	}
	defer t.releaseQueues([]int{q})
	t.mu.Lock()
	if t.status&StatusDriverOK == 0 || t.status&StatusNeedsReset != 0 || !t.queues[q].ready {
		t.mu.Unlock()
		return ErrQueueNotRunning
	}
	vq, features := t.queues[q].vq, t.driverFeatures
	t.mu.Unlock()
	if !fill(vq, features) {
		return nil
	}
	return t.raise()
}
