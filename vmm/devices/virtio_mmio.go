package devices

import (
	"context"
	"sync"

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
// device. Queue notifications are processed synchronously in the caller's
// goroutine (the vCPU's, for now).
type VirtioMMIO struct {
	// Immutable after construction.
	ctx context.Context
	dev VirtioDevice
	mem *memory.Memory
	irq Interrupt

	mu sync.Mutex
	// status is the device status register.
	status uint32
	// deviceFeaturesSel, driverFeaturesSel and queueSel are selectors.
	deviceFeaturesSel, driverFeaturesSel, queueSel uint32
	// driverFeatures is what the driver accepted.
	driverFeatures uint64
	// interruptStatus is the InterruptStatus register.
	interruptStatus uint32
	// queues is per queue of the device.
	queues []queueState
}

// NewVirtioMMIO returns the transport of dev over guest memory mem,
// raising irq on used-ring updates. ctx bounds the device's backend IO.
func NewVirtioMMIO(ctx context.Context, dev VirtioDevice, mem *memory.Memory, irq Interrupt) *VirtioMMIO {
	t := &VirtioMMIO{ctx: ctx, dev: dev, mem: mem, irq: irq}
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
	t.driverFeatures, t.interruptStatus = 0, 0
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
	if offset == mmioQueueNotify {
		t.notify(int(v))
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
	case mmioQueueReady:
		t.setQueueReadyLocked(q, v == 1)
	case mmioInterruptACK:
		t.interruptStatus &^= v
	case mmioStatus:
		t.setStatusLocked(v)
	}
}

// setQueueReadyLocked enables a queue after validating its rings; an
// unusable queue sets NEEDS_RESET instead.
func (t *VirtioMMIO) setQueueReadyLocked(q *queueState, ready bool) {
	if q == nil {
		return
	}
	if !ready {
		q.ready, q.vq = false, nil
		return
	}
	max := t.dev.QueueMaxSizes()[t.queueSel]
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

// notify processes queue q if the driver is running and the queue ready,
// then raises the interrupt if anything was used.
func (t *VirtioMMIO) notify(q int) {
	t.mu.Lock()
	if t.status&StatusDriverOK == 0 || t.status&StatusNeedsReset != 0 || q < 0 || q >= len(t.queues) || !t.queues[q].ready {
		t.mu.Unlock()
		return
	}
	vq, features := t.queues[q].vq, t.driverFeatures
	// Processing holds the lock: the transport serves one request batch
	// at a time, and a concurrent reset waits for it.
	used := t.dev.Process(t.ctx, q, vq, features)
	if used {
		t.interruptStatus |= interruptUsedBuffer
	}
	t.mu.Unlock()
	if used {
		t.irq.Trigger()
	}
}
