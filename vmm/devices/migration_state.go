package devices

import (
	"fmt"
	"time"

	"tern/vmm/memory"
)

// UARTState is the UART's guest-visible state as plain data, for
// migration.
type UARTState struct {
	IER, LCR, MCR, SCR, DLL, DLM uint8
	FIFO, THREPending            bool
	// Input is the receive queue, Input[0] in RBR.
	Input []byte
}

// State captures the UART's registers and receive queue.
func (u *UART) State() UARTState {
	u.mu.Lock()
	defer u.mu.Unlock()
	return UARTState{
		IER: u.ier, LCR: u.lcr, MCR: u.mcr, SCR: u.scr, DLL: u.dll, DLM: u.dlm,
		FIFO: u.fifo, THREPending: u.threPending, Input: append([]byte(nil), u.input...),
	}
}

// SetState loads s into the UART (the input queue is cut at its bound).
func (u *UART) SetState(s UARTState) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.ier, u.lcr, u.mcr, u.scr, u.dll, u.dlm = s.IER&0x0f, s.LCR, s.MCR&0x1f, s.SCR, s.DLL, s.DLM
	u.fifo, u.threPending = s.FIFO, s.THREPending
	u.input = append([]byte(nil), s.Input[:min(len(s.Input), uartInputMax)]...)
}

// Reassert pulses the UART's interrupt line if an interrupt it enables is
// pending (received data, or the transmit holding register's empty
// event): after SetState on a migration target, so a pending condition
// is served even if the edge that announced it was consumed on the source
// without the guest having run its handler. A pulse with nothing new is a
// spurious interrupt the guest's driver reads IIR for and ignores.
func (u *UART) Reassert() {
	u.mu.Lock()
	pending := u.ier&ierRDA != 0 && len(u.input) > 0 || u.ier&ierTHRE != 0 && u.threPending
	u.mu.Unlock()
	if pending {
		u.irq.Trigger()
	}
}

// HistoryState is a History's retained bytes and their absolute end.
type HistoryState struct {
	// End is the absolute offset one past the newest byte.
	End uint64
	// Data are the retained bytes, ending at End.
	Data []byte
}

// State captures the retained bytes and the end offset.
func (h *History) State() HistoryState {
	start, end := h.Bounds()
	data, _, _, _ := h.ReadFrom(start, int(end-start))
	return HistoryState{End: end, Data: data}
}

// Restore replaces the history with s, keeping the newest capacity bytes,
// so that offsets continue where the sender's left off; subscribers are
// woken.
func (h *History) Restore(s HistoryState) {
	data := s.Data
	if uint64(len(data)) > s.End {
		data = data[uint64(len(data))-s.End:]
	}
	h.mu.Lock()
	h.end = s.End - uint64(len(data))
	clear(h.ring)
	h.mu.Unlock()
	h.Write(data)
}

// BootTimerState is whether the guest wrote its magic and when.
type BootTimerState struct {
	Done    bool
	Elapsed time.Duration
}

// State captures the boot timer.
func (b *BootTimer) State() BootTimerState {
	e, ok := b.Elapsed()
	return BootTimerState{Done: ok, Elapsed: e}
}

// Restore marks the timer done with the sender's elapsed time, unless s
// is not done or this timer already is.
func (b *BootTimer) Restore(s BootTimerState) {
	if !s.Done {
		return
	}
	b.once.Do(func() {
		b.elapsed = s.Elapsed
		close(b.done)
	})
}

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
