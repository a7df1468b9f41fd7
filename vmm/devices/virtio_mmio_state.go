package devices

import (
	"fmt"
	"time"

	"tern/vmm/memory"
)

// virtioMMIOStateVersion is the version of the transport state SaveState
// writes: Status, DeviceFeaturesSel, DriverFeaturesSel, QueueSel
// (uint32 each), DriverFeatures (uint64), InterruptStatus (uint32), the
// queue count (uint16) and per queue its size (uint16), ready (one byte)
// and ring addresses (uint64 each).
const virtioMMIOStateVersion = 1

// maxVirtioStateQueues bounds the queues of a transport state read.
const maxVirtioStateQueues = 64

// VirtioQueueState is the driver's configuration of one virtqueue.
type VirtioQueueState struct {
	Num                  uint16
	Ready                bool
	Desc, Driver, Device uint64
}

// VirtioMMIOState is a virtio-mmio transport's registers as plain data,
// for migration. The rings live in guest memory, which migrates on its
// own: a ready queue is rebuilt from them on SetState, its next available
// entry the used ring's index. That is exact at a request boundary: on
// the synchronous path once the vCPUs are parked (a notification is
// served to the end on the notifying vCPU), on the asynchronous path
// once the transport is also quiesced (Quiesce). InterruptStatus travels
// with it; the interrupt line's own state is the irqchip's.
type VirtioMMIOState struct {
	Status                                         uint32
	DeviceFeaturesSel, DriverFeaturesSel, QueueSel uint32
	DriverFeatures                                 uint64
	InterruptStatus                                uint32
	Queues                                         []VirtioQueueState
}

// State captures the transport's registers.
func (t *VirtioMMIO) State() VirtioMMIOState {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := VirtioMMIOState{Status: t.status, DeviceFeaturesSel: t.deviceFeaturesSel, DriverFeaturesSel: t.driverFeaturesSel,
		QueueSel: t.queueSel, DriverFeatures: t.driverFeatures, InterruptStatus: t.interruptStatus}
	for _, q := range t.queues {
		s.Queues = append(s.Queues, VirtioQueueState{Num: q.num, Ready: q.ready, Desc: q.desc, Driver: q.driver, Device: q.device})
	}
	return s
}

// SetState loads s into the transport, rebuilding every ready queue from
// guest memory. A state of another device (another queue count) or a
// ready queue whose rings do not fit this memory is an error, and leaves
// the transport reset. Call it with no vCPU running. On the asynchronous
// path it stops the workers first and starts those of the restored
// state after; each makes a pass over its queue at once, serving what
// the source was notified of but had not served, unless the transport is
// quiesced (then the pass waits for Resume).
func (t *VirtioMMIO) SetState(s VirtioMMIOState) error {
	t.lifecycle.Lock()
	defer t.lifecycle.Unlock()
	t.stopWorkers(t.allQueues()) // a Notifier's Close error leaves nothing running
	defer t.startWorkers()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.resetLocked()
	max := t.dev.QueueMaxSizes()
	if len(s.Queues) != len(max) {
		return fmt.Errorf("restoring virtio-mmio state: %d queues, this device has %d", len(s.Queues), len(max))
	}
	queues := make([]queueState, len(max))
	for i, q := range s.Queues {
		queues[i] = queueState{num: q.Num, ready: q.Ready, desc: q.Desc, driver: q.Driver, device: q.Device}
		if !q.Ready {
			continue
		}
		if q.Num == 0 || q.Num > max[i] {
			return fmt.Errorf("restoring virtio-mmio state: queue %d of size %d, at most %d", i, q.Num, max[i])
		}
		vq, err := newVirtqueue(t.mem, q.Num, memory.GPA(q.Desc), memory.GPA(q.Driver), memory.GPA(q.Device))
		if err != nil {
			return fmt.Errorf("restoring virtio-mmio state: queue %d: %w", i, err)
		}
		queues[i].vq = vq
	}
	t.status, t.deviceFeaturesSel, t.driverFeaturesSel, t.queueSel = s.Status, s.DeviceFeaturesSel, s.DriverFeaturesSel, s.QueueSel
	t.driverFeatures, t.interruptStatus, t.queues = s.DriverFeatures, s.InterruptStatus, queues
	if t.interruptStatus != 0 {
		t.raisedAt = time.Now() // raised on the source, so RaiseUnacknowledged covers an edge lost in the move
	}
	return nil
}

// StateKind names the transport's state by its device: VirtioBlkStateKind
// for a disk, VirtioNetStateKind for a network card. The encoding is the
// same; the kinds keep a disk's state from loading into a card.
func (t *VirtioMMIO) StateKind() string {
	switch id := t.dev.DeviceID(); id {
	case VirtioBlkDeviceID:
		return VirtioBlkStateKind
	case VirtioNetDeviceID:
		return VirtioNetStateKind
	default:
		return fmt.Sprintf("virtio-%d", id)
	}
}

// StateVersion returns the version SaveState writes.
func (t *VirtioMMIO) StateVersion() uint16 { return virtioMMIOStateVersion }

// SaveState returns the transport's registers, encoded (the rings are in
// guest memory).
func (t *VirtioMMIO) SaveState() ([]byte, error) {
	s := t.State()
	w := &stateWriter{}
	w.u32(s.Status)
	w.u32(s.DeviceFeaturesSel)
	w.u32(s.DriverFeaturesSel)
	w.u32(s.QueueSel)
	w.u64(s.DriverFeatures)
	w.u32(s.InterruptStatus)
	w.u16(uint16(len(s.Queues)))
	for _, q := range s.Queues {
		w.u16(q.Num)
		w.bool(q.Ready)
		w.u64(q.Desc)
		w.u64(q.Driver)
		w.u64(q.Device)
	}
	return w.b, nil
}

// RestoreState loads an encoded state (SetState); a state that does not
// fit this transport is ErrStateMismatch and leaves it reset.
func (t *VirtioMMIO) RestoreState(version uint16, b []byte) error {
	s, err := decodeVirtioMMIOState(t.StateKind(), version, b)
	if err != nil {
		return err
	}
	if err := t.SetState(s); err != nil {
		return fmt.Errorf("%w: %w", ErrStateMismatch, err)
	}
	return nil
}

func decodeVirtioMMIOState(kind string, version uint16, b []byte) (VirtioMMIOState, error) {
	if err := CheckStateVersion(kind, virtioMMIOStateVersion, version); err != nil {
		return VirtioMMIOState{}, err
	}
	r := &stateReader{b: b}
	s := VirtioMMIOState{Status: r.u32(), DeviceFeaturesSel: r.u32(), DriverFeaturesSel: r.u32(), QueueSel: r.u32(),
		DriverFeatures: r.u64(), InterruptStatus: r.u32()}
	n := int(r.u16())
	if r.err == nil && n > maxVirtioStateQueues {
		r.fail(fmt.Errorf("%d virtqueues, at most %d", n, maxVirtioStateQueues))
	}
	for i := 0; i < n && r.err == nil; i++ {
		q := VirtioQueueState{Num: r.u16(), Ready: r.bool()}
		q.Desc, q.Driver, q.Device = r.u64(), r.u64(), r.u64()
		s.Queues = append(s.Queues, q)
	}
	if err := r.finish(kind); err != nil {
		return VirtioMMIOState{}, err
	}
	return s, nil
}
