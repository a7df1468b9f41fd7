package devices

import (
	"context"
	"sync"
	"time"

	"tern/vmm/memory"
)

// Virtio-mmio register offsets (virtio 1.x, section 4.2.2).
const (
	mmioMagicValue        = 0x000
	mmioVersion           = 0x004
	mmioDeviceID          = 0x008
	mmioVendorID          = 0x00c
	mmioDeviceFeatures    = 0x010
	mmioDeviceFeaturesSel = 0x014
	mmioDriverFeatures    = 0x020
	mmioDriverFeaturesSel = 0x024
	mmioQueueSel          = 0x030
	mmioQueueNumMax       = 0x034
	mmioQueueNum          = 0x038
	mmioQueueReady        = 0x044
	mmioQueueNotify       = 0x050
	mmioInterruptStatus   = 0x060
	mmioInterruptACK      = 0x064
	mmioStatus            = 0x070
	mmioQueueDescLow      = 0x080
	mmioQueueDescHigh     = 0x084
	mmioQueueDriverLow    = 0x090
	mmioQueueDriverHigh   = 0x094
	mmioQueueDeviceLow    = 0x0a0
	mmioQueueDeviceHigh   = 0x0a4
	mmioConfigGeneration  = 0x0fc
	mmioConfig            = 0x100

	// MMIOSize is the size of one virtio-mmio device window.
	MMIOSize = 0x200
	// QueueNotifyOffset is the QueueNotify register's offset in the
	// window: the driver writes a queue's index there (4 bytes), where
	// an ioeventfd catches it.
	QueueNotifyOffset = mmioQueueNotify

	virtioMagic   = 0x74726976 // "virt"
	virtioVersion = 2          // modern
	// VendorID is the vendor id tern reports: "tern" as little-endian
	// ASCII, as QEMU reports "QEMU".
	VendorID = 0x6e726574
)

// Device status bits.
const (
	StatusAcknowledge = 1
	StatusDriver      = 2
	StatusDriverOK    = 4
	StatusFeaturesOK  = 8
	StatusNeedsReset  = 64
	StatusFailed      = 128
)

// FeatureVersion1 is VIRTIO_F_VERSION_1, which the transport always offers
// and requires.
const FeatureVersion1 = 1 << 32

// interruptUsedBuffer is the InterruptStatus bit for a used-ring update.
const interruptUsedBuffer = 1

// VirtioDevice is a virtio device type behind the transport.
type VirtioDevice interface {
	// DeviceID is the virtio device type (2 for block).
	DeviceID() uint32
	// Features are the device-specific feature bits offered.
	Features() uint64
	// QueueMaxSizes gives, per queue, its maximum size.
	QueueMaxSizes() []uint16
	// ReadConfig reads the device-specific configuration space.
	ReadConfig(offset uint64, data []byte)
	// Process serves every available chain of queue q, pushing each to
	// the used ring, and reports whether it pushed any.
	Process(ctx context.Context, q int, vq *Virtqueue, features uint64) bool
}

// queueState is the driver's configuration of one queue.
type queueState struct {
	num                  uint16
	ready                bool
	desc, driver, device uint64
	vq                   *Virtqueue
}

// VirtioMMIO is the virtio-mmio transport (modern register layout) for one
// device.
//
// A queue is processed in one of two ways. Synchronously, a QueueNotify
// write is served to the end in the caller's goroutine (the vCPU's) before
// the write returns: tern's own guests, which poll the used ring, and
// their migration rely on that. With Notifiers (NewAsyncVirtioMMIO), each
// ready queue of a running device (DRIVER_OK) gets its own goroutine,
// woken by a Notifier (an ioeventfd on QueueNotify), so a guest's IO no
// longer runs on the vCPU that kicked it; see virtio_queue_worker.go.
// Either way the used-buffer bit of InterruptStatus is set before the
// interrupt is raised, and only the driver's InterruptACK clears it.
type VirtioMMIO struct {
	// Immutable after construction.
	ctx       context.Context
	dev       VirtioDevice
	mem       *memory.Memory
	irq       Interrupt
	notifiers Notifiers // nil: synchronous
	// run holds one token per queue (a channel of capacity 1): whoever
	// processes queue q, or changes its configuration under a processor,
	// holds run[q]; Quiesce holds them all.
	run []chan struct{}

	// lifecycle serializes what starts and stops queue workers: status
	// and QueueReady writes, SetState and Close. It is taken before mu.
	lifecycle sync.Mutex
	// quiesce serializes Quiesce and Resume and guards quiesced.
	quiesce  sync.Mutex
	quiesced bool

	mu sync.Mutex
	// status is the device status register.
	status uint32
	// deviceFeaturesSel, driverFeaturesSel and queueSel are selectors.
	deviceFeaturesSel, driverFeaturesSel, queueSel uint32
	// driverFeatures is what the driver accepted.
	driverFeatures uint64
	// interruptStatus is the InterruptStatus register.
	interruptStatus uint32
	// raisedAt is when the interrupt was last raised with
	// interruptStatus set; zero while interruptStatus is clear (see
	// RaiseUnacknowledged).
	raisedAt time.Time
	// queues is per queue of the device.
	queues []queueState
	// workers is per queue: its goroutine, or nil (synchronous, or not
	// running). Changed only under lifecycle too.
	workers []*queueWorker
	// closed is set by Close: no worker starts after it.
	closed bool
}

// NewVirtioMMIO returns the transport of dev over guest memory mem,
// raising irq on used-ring updates and processing each notification
// synchronously in the notifying goroutine. ctx bounds the device's
// backend IO.
func NewVirtioMMIO(ctx context.Context, dev VirtioDevice, mem *memory.Memory, irq Interrupt) *VirtioMMIO {
	return NewAsyncVirtioMMIO(ctx, dev, mem, irq, nil)
}

// NewAsyncVirtioMMIO is NewVirtioMMIO with each queue processed on its own
// goroutine, woken by the Notifier notifiers opens for it once the driver
// made the queue ready and the device DRIVER_OK. A nil notifiers is the
// synchronous transport. Close stops the goroutines.
func NewAsyncVirtioMMIO(ctx context.Context, dev VirtioDevice, mem *memory.Memory, irq Interrupt, notifiers Notifiers) *VirtioMMIO {
	n := len(dev.QueueMaxSizes())
	t := &VirtioMMIO{ctx: ctx, dev: dev, mem: mem, irq: irq, notifiers: notifiers, run: make([]chan struct{}, n)}
	for i := range t.run {
		t.run[i] = make(chan struct{}, 1)
	}
	t.workers = make([]*queueWorker, n)
	t.resetLocked()
	return t
}

// Status returns the device status register.
func (t *VirtioMMIO) Status() uint32 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.status
}

func (t *VirtioMMIO) resetLocked() {
	t.status, t.deviceFeaturesSel, t.driverFeaturesSel, t.queueSel = 0, 0, 0, 0
	t.driverFeatures, t.interruptStatus, t.raisedAt = 0, 0, time.Time{}
	t.queues = make([]queueState, len(t.dev.QueueMaxSizes()))
}

func (t *VirtioMMIO) offeredFeatures() uint64 { return t.dev.Features() | FeatureVersion1 }

// selectedLocked returns the queue QueueSel names, or nil.
func (t *VirtioMMIO) selectedLocked() *queueState {
	if int(t.queueSel) < len(t.queues) {
		return &t.queues[t.queueSel]
	}
	return nil
}

// ReadMMIO handles a guest read in the device window.
func (t *VirtioMMIO) ReadMMIO(offset uint64, data []byte) {
	if offset >= mmioConfig {
		t.dev.ReadConfig(offset-mmioConfig, data)
		return
	}
	clear(data)
	if len(data) != 4 || offset%4 != 0 {
		return // registers are 32-bit wide and aligned
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	var v uint32
	switch offset {
	case mmioMagicValue:
		v = virtioMagic
	case mmioVersion:
		v = virtioVersion
	case mmioDeviceID:
		v = t.dev.DeviceID()
	case mmioVendorID:
		v = VendorID
	case mmioDeviceFeatures:
		if t.deviceFeaturesSel < 2 {
			v = uint32(t.offeredFeatures() >> (32 * t.deviceFeaturesSel))
		}
	case mmioQueueNumMax:
		if q := t.selectedLocked(); q != nil {
			v = uint32(t.dev.QueueMaxSizes()[t.queueSel])
		}
	case mmioQueueReady:
		if q := t.selectedLocked(); q != nil && q.ready {
			v = 1
		}
	case mmioInterruptStatus:
		v = t.interruptStatus
	case mmioStatus:
		v = t.status
	case mmioConfigGeneration:
		v = 0 // the configuration never changes
	}
	putLittleEndian(data, uint64(v))
}

// WriteMMIO handles a guest write in the device window.
func (t *VirtioMMIO) WriteMMIO(offset uint64, data []byte) {
	if offset >= mmioConfig || len(data) != 4 || offset%4 != 0 {
		return // read-only configuration; registers are 32-bit
	}
	v := uint32(littleEndian(data))
	switch offset {
	case mmioQueueNotify:
		t.notify(int(v))
		return
	case mmioStatus:
		t.writeStatus(v)
		return
	case mmioQueueReady:
		t.writeQueueReady(v == 1)
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	q := t.selectedLocked()
	setAddr := func(field *uint64, high bool) {
		if q == nil || q.ready {
			return
		}
		if high {
			*field = *field&0xffffffff | uint64(v)<<32
		} else {
			*field = *field&^0xffffffff | uint64(v)
		}
	}
	switch offset {
	case mmioDeviceFeaturesSel:
		t.deviceFeaturesSel = v
	case mmioDriverFeaturesSel:
		t.driverFeaturesSel = v
	case mmioDriverFeatures:
		if t.driverFeaturesSel < 2 && t.status&StatusFeaturesOK == 0 {
			shift := 32 * t.driverFeaturesSel
			t.driverFeatures = t.driverFeatures&^(0xffffffff<<shift) | uint64(v)<<shift
		}
	case mmioQueueSel:
		t.queueSel = v
	case mmioQueueNum:
		if q != nil && !q.ready {
			q.num = uint16(v)
		}
	case mmioQueueDescLow, mmioQueueDescHigh:
		if q != nil {
			setAddr(&q.desc, offset == mmioQueueDescHigh)
		}
	case mmioQueueDriverLow, mmioQueueDriverHigh:
		if q != nil {
			setAddr(&q.driver, offset == mmioQueueDriverHigh)
		}
	case mmioQueueDeviceLow, mmioQueueDeviceHigh:
		if q != nil {
			setAddr(&q.device, offset == mmioQueueDeviceHigh)
		}
	case mmioInterruptACK:
		t.interruptStatus &^= v
		if t.interruptStatus == 0 {
			t.raisedAt = time.Time{}
		}
	}
}

// writeStatus applies a driver write of the status register. A reset
// first stops the queue workers and waits for any request in flight, so
// that nothing touches the rings once the write returns; DRIVER_OK starts
// the workers of the ready queues.
func (t *VirtioMMIO) writeStatus(v uint32) {
	t.lifecycle.Lock()
	defer t.lifecycle.Unlock()
	if v == 0 {
		t.stopWorkers(t.allQueues())
		if !t.holdQueues(t.allQueues()) {
			return // the device's context ended: the VM is closing
		}
		defer t.releaseQueues(t.allQueues())
		t.mu.Lock()
		t.resetLocked()
		t.mu.Unlock()
		return
	}
	t.mu.Lock()
	t.setStatusLocked(v)
	t.mu.Unlock()
	t.startWorkers()
}

// writeQueueReady applies a driver write of QueueReady for the selected
// queue: disabling one stops its worker and waits for its request in
// flight; enabling one on a running device starts its worker.
func (t *VirtioMMIO) writeQueueReady(ready bool) {
	t.lifecycle.Lock()
	defer t.lifecycle.Unlock()
	t.mu.Lock()
	q := int(t.queueSel)
	t.mu.Unlock()
	if q >= len(t.run) {
		return
	}
	if !ready {
		t.stopWorkers([]int{q})
		if !t.holdQueues([]int{q}) {
			return
		}
		defer t.releaseQueues([]int{q})
	}
	t.mu.Lock()
	t.setQueueReadyLocked(&t.queues[q], q, ready)
	t.mu.Unlock()
	t.startWorkers()
}

// setQueueReadyLocked enables queue index i, q, after validating its
// rings; an unusable queue sets NEEDS_RESET instead. Enabling a ready
// queue does nothing: rebuilding it would rewind it under its processor.
func (t *VirtioMMIO) setQueueReadyLocked(q *queueState, i int, ready bool) {
	if !ready {
		q.ready, q.vq = false, nil
		return
	}
	if q.ready {
		return
	}
	max := t.dev.QueueMaxSizes()[i]
	if q.num == 0 || q.num > max {
		t.status |= StatusNeedsReset
		return
	}
	vq, err := newVirtqueue(t.mem, q.num, memory.GPA(q.desc), memory.GPA(q.driver), memory.GPA(q.device))
	if err != nil {
		t.status |= StatusNeedsReset
		return
	}
	q.ready, q.vq = true, vq
}

// setStatusLocked applies a driver write of the status register.
func (t *VirtioMMIO) setStatusLocked(v uint32) {
	if v == 0 {
		t.resetLocked()
		return
	}
	if v&StatusFeaturesOK != 0 && t.status&StatusFeaturesOK == 0 {
		// Accept only a subset of what was offered, including VERSION_1;
		// otherwise leave FEATURES_OK clear for the driver to see.
		if t.driverFeatures&^t.offeredFeatures() != 0 || t.driverFeatures&FeatureVersion1 == 0 {
			v &^= StatusFeaturesOK
		}
	}
	t.status = v | t.status&StatusNeedsReset
}

// notify serves a QueueNotify write that reached the transport: on the
// synchronous path it processes the queue in the caller's goroutine. A
// queue with a worker is served there instead (its ioeventfd takes the
// driver's writes; one that reaches here is redundant).
func (t *VirtioMMIO) notify(q int) {
	if q < 0 || q >= len(t.run) {
		return
	}
	t.mu.Lock()
	async := t.workers[q] != nil
	t.mu.Unlock()
	if async {
		return
	}
	if !t.holdQueues([]int{q}) {
		return
	}
	defer t.releaseQueues([]int{q})
	t.processQueue(q)
}

// processQueue serves queue q if the driver is running and the queue
// ready, then sets the used-buffer bit and raises the interrupt if
// anything was used. The caller holds run[q], so the queue's
// configuration and its Virtqueue are its own until it returns; the
// device's IO runs without mu, so register accesses (InterruptStatus,
// InterruptACK) from vCPUs go on meanwhile.
func (t *VirtioMMIO) processQueue(q int) {
	t.mu.Lock()
	if t.status&StatusDriverOK == 0 || t.status&StatusNeedsReset != 0 || !t.queues[q].ready {
		t.mu.Unlock()
		return
	}
	vq, features := t.queues[q].vq, t.driverFeatures
	t.mu.Unlock()
	if !t.dev.Process(t.ctx, q, vq, features) {
		return
	}
	t.raise()
}

// raise sets the used-buffer bit of InterruptStatus and raises the
// interrupt.
func (t *VirtioMMIO) raise() error {
	t.mu.Lock()
	t.interruptStatus |= interruptUsedBuffer
	t.raisedAt = time.Now()
	t.mu.Unlock()
	return t.irq.Trigger()
}

// RaiseUnacknowledged raises the interrupt again when InterruptStatus has
// stood set, unacknowledged, for at least after since it was last raised,
// and reports whether it did. A driver acknowledges what it reads from
// InterruptStatus in its handler, so a status left standing means the
// guest never ran the handler: the edge was lost on its way (the line is
// edge-triggered, and an edge that meets a masked or busy pin is gone)
// and the driver waits for a completion it will never be told of. An
// extra edge costs a guest that was merely slow one handler call that
// finds nothing to do. The VM calls it from a watchdog for interrupt-driven
// guests.
func (t *VirtioMMIO) RaiseUnacknowledged(after time.Duration) (bool, error) {
	t.mu.Lock()
	stale := t.interruptStatus != 0 && !t.raisedAt.IsZero() && time.Since(t.raisedAt) >= after
	if stale {
		t.raisedAt = time.Now()
	}
	t.mu.Unlock()
	if !stale {
		return false, nil
	}
	return true, t.irq.Trigger()
}
