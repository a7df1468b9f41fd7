package devices

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"

	"tern/vmm/memory"
)

// Virtio-net constants (virtio 1.x, section 5.1).
const (
	// VirtioNetDeviceID is the virtio device type of a network card.
	VirtioNetDeviceID = 1

	FeatureNetMAC    = 1 << 5  // VIRTIO_NET_F_MAC: the MAC is in the config space
	FeatureNetStatus = 1 << 16 // VIRTIO_NET_F_STATUS: the config space has a link status

	// NetHeaderSize is struct virtio_net_hdr as virtio 1.x lays it out
	// whatever the features: flags, gso_type, hdr_len, gso_size,
	// csum_start, csum_offset, num_buffers. It leads every buffer of both
	// queues.
	NetHeaderSize = 12
	// MaxFrameBytes is the longest frame the device moves either way:
	// the most a TAP gives in one read.
	MaxFrameBytes = 65535
	// ethHeaderSize is an Ethernet header: no shorter frame is sent.
	ethHeaderSize = 14

	netLinkUp = 1 // VIRTIO_NET_S_LINK_UP

	netRxQueue   = 0
	netTxQueue   = 1
	netQueueSize = 256
)

// NetBackend is the host side of a network card, one Ethernet frame per
// call (tern/vmm/tap.Device is one). ReadFrame waits for a frame and is
// called from one goroutine; Close makes a waiting ReadFrame return.
type NetBackend interface {
	ReadFrame(p []byte) (int, error)
	WriteFrame(p []byte) error
	Close() error
}

// errBadFrame marks a chain or frame the device drops.
var errBadFrame = errors.New("bad virtio-net buffer")

// NetStats counts a network card's frames.
type NetStats struct {
	// TxFrames went out to the backend; TxDropped were dropped: a
	// malformed chain, a header asking for an offload, a frame shorter
	// than an Ethernet header, or a backend write error.
	TxFrames, TxDropped uint64
	// RxFrames went into the driver's buffers; RxDropped were dropped: a
	// receive chain too small for the frame or not device-writable.
	RxFrames, RxDropped uint64
}

// VirtioNet is a virtio-net device (no offloads, no control queue, no
// mergeable receive buffers) over a NetBackend, behind its own
// virtio-mmio transport. Queue 0 receives, queue 1 transmits.
//
// Transmission runs where the transport delivers the driver's
// notifications (Process). Reception runs on the device's own goroutine:
// it reads one frame from the backend, then waits, holding that frame,
// until the driver has a receive buffer for it; a notification of queue 0
// (the driver added buffers) or Resume wakes it. Frames behind the held
// one wait in the backend (a TAP's queue, which drops when full, as a
// wire would).
type VirtioNet struct {
	// Immutable after construction.
	backend   NetBackend
	mac       [6]byte
	mem       *memory.Memory
	transport *VirtioMMIO
	// cancel ends the transport's context: a Deliver waiting out a
	// Quiesce returns.
	cancel context.CancelFunc
	// rxWake holds a token when the receive side should look again.
	rxWake chan struct{}
	// stop is closed by Close; rxDone when the receive goroutine ended.
	stop, rxDone chan struct{}
	closeOnce    sync.Once
	closeErr     error

	// txBuf gathers one frame and txChain holds its descriptors; used
	// only by Process, which the transport serializes.
	txBuf   []byte
	txChain []Desc
	// rxChain holds a receive chain's descriptors, rxFrame the frame
	// being delivered and rxPlaced whether the last delivery finished
	// with it; fillRxFn is fillPending, bound once so that a delivery
	// allocates nothing. Used only by the receive goroutine (Deliver
	// calls fill on its caller's goroutine).
	rxChain  []Desc
	rxFrame  []byte
	rxPlaced bool
	fillRxFn func(vq *Virtqueue, features uint64) bool

	// deliverMu is held by the receive goroutine while it writes into
	// guest memory, so Pause can wait a delivery out.
	deliverMu sync.Mutex
	// paused holds reception until Resume; guarded by deliverMu.
	paused bool

	// rxErr is the backend error that ended reception, if any.
	rxErr                                  atomic.Pointer[error]
	txFrames, txDropped, rxFrames, rxDrops atomic.Uint64
}

// NewVirtioNet returns a network card with address mac over backend,
// which it owns from then on, serving guest memory mem and raising irq on
// used-ring updates; its receive goroutine runs until Close. Its
// transport serves notifications synchronously.
func NewVirtioNet(backend NetBackend, mac net.HardwareAddr, mem *memory.Memory, irq Interrupt) (*VirtioNet, error) {
	return NewAsyncVirtioNet(backend, mac, mem, irq, nil)
}

// NewAsyncVirtioNet is NewVirtioNet with its transport's queues served on
// their own goroutines, woken by notifiers (NewAsyncVirtioMMIO).
func NewAsyncVirtioNet(backend NetBackend, mac net.HardwareAddr, mem *memory.Memory, irq Interrupt, notifiers Notifiers) (*VirtioNet, error) {
	if len(mac) != 6 {
		return nil, fmt.Errorf("creating virtio-net: MAC %v is not 6 bytes", mac)
	}
	n := &VirtioNet{
		backend: backend, mem: mem,
		rxWake: make(chan struct{}, 1), stop: make(chan struct{}), rxDone: make(chan struct{}),
		txBuf: make([]byte, NetHeaderSize+MaxFrameBytes),
	}
	copy(n.mac[:], mac)
	n.fillRxFn = n.fillPending
	ctx, cancel := context.WithCancel(context.Background())
	n.transport, n.cancel = NewAsyncVirtioMMIO(ctx, n, mem, irq, notifiers), cancel
	go n.receive()
	return n, nil
}

// Transport is the device's virtio-mmio transport, for the MMIO bus.
func (n *VirtioNet) Transport() *VirtioMMIO { return n.transport }

// DeviceID returns VirtioNetDeviceID.
func (n *VirtioNet) DeviceID() uint32 { return VirtioNetDeviceID }

// Features offers MAC and STATUS.
func (n *VirtioNet) Features() uint64 { return FeatureNetMAC | FeatureNetStatus }

// QueueMaxSizes reports the receive and the transmit queue.
func (n *VirtioNet) QueueMaxSizes() []uint16 { return []uint16{netQueueSize, netQueueSize} }

// ReadConfig reads struct virtio_net_config: mac at 0, status at 6 (link
// up, always); other fields read zero.
func (n *VirtioNet) ReadConfig(offset uint64, data []byte) {
	var cfg [12]byte
	copy(cfg[:], n.mac[:])
	binary.LittleEndian.PutUint16(cfg[6:], netLinkUp)
	clear(data)
	if offset < uint64(len(cfg)) {
		copy(data, cfg[offset:])
	}
}

// Process transmits the available chains of the transmit queue, at most
// the queue's size per call (as VirtioBlk.Process, against a guest that
// rewrites its own ring), each returned with 0 bytes written. A
// notification of the receive queue wakes the receive goroutine.
func (n *VirtioNet) Process(_ context.Context, q int, vq *Virtqueue, _ uint64) bool {
	if q == netRxQueue {
		n.wake()
		return false
	}
	used := false
	for range vq.size {
		head, ok, err := vq.Pop()
		if err != nil || !ok {
			return used
		}
		n.transmit(vq, head)
		if vq.PushUsed(head, 0) != nil {
			return used
		}
		used = true
	}
	return used
}

// transmit sends the frame of the chain at head, or counts it dropped.
func (n *VirtioNet) transmit(vq *Virtqueue, head uint16) {
	chain, err := vq.AppendChain(n.txChain, head)
	n.txChain = chain
	if err == nil {
		var frame []byte
		if frame, err = txFrame(n.mem, chain, n.txBuf); err == nil {
			err = n.backend.WriteFrame(frame)
		}
	}
	if err != nil {
		n.txDropped.Add(1)
		return
	}
	n.txFrames.Add(1)
}

// txFrame gathers a transmit chain into buf and returns the frame after
// its header. Every buffer must be device-readable, the header must ask
// for no offload (none was offered), and the frame must hold an Ethernet
// header and fit MaxFrameBytes.
func txFrame(mem *memory.Memory, chain []Desc, buf []byte) ([]byte, error) {
	n := 0
	for _, d := range chain {
		if d.Write {
			return nil, fmt.Errorf("%w: a device-writable buffer in a transmit chain", errBadFrame)
		}
		if uint64(d.Len) > uint64(len(buf)-n) {
			return nil, fmt.Errorf("%w: transmit chain longer than %d bytes", errBadFrame, len(buf))
		}
		if err := mem.Read(d.Addr, buf[n:n+int(d.Len)]); err != nil {
			return nil, fmt.Errorf("%w: %w", errBadFrame, err)
		}
		n += int(d.Len)
	}
	if n < NetHeaderSize {
		return nil, fmt.Errorf("%w: %d bytes hold no header", errBadFrame, n)
	}
	if err := checkTxHeader(buf[:NetHeaderSize]); err != nil {
		return nil, err
	}
	frame := buf[NetHeaderSize:n]
	if len(frame) < ethHeaderSize {
		return nil, fmt.Errorf("%w: %d-byte frame is shorter than an Ethernet header", errBadFrame, len(frame))
	}
	return frame, nil
}

// checkTxHeader refuses a header that asks for checksum or segmentation
// offload: they were not offered, and the backend would send the frame
// with its checksum unfilled or unsegmented.
func checkTxHeader(h []byte) error {
	flags, gsoType := h[0], h[1]
	if flags != 0 || gsoType != 0 {
		return fmt.Errorf("%w: header asks for an offload (flags %#x, gso_type %#x) that was not offered", errBadFrame, flags, gsoType)
	}
	return nil
}

// wake tells the receive goroutine to look again, without blocking.
func (n *VirtioNet) wake() {
	select {
	case n.rxWake <- struct{}{}:
	default:
	}
}

// receive is the receive goroutine: read a frame, deliver it, repeat,
// until Close or a backend error.
func (n *VirtioNet) receive() {
	defer close(n.rxDone)
	buf := make([]byte, MaxFrameBytes)
	for {
		k, err := n.backend.ReadFrame(buf)
		if err != nil {
			select {
			case <-n.stop:
			default:
				err = fmt.Errorf("virtio-net receive stopped: %w", err)
				n.rxErr.Store(&err)
			}
			return
		}
		if !n.hold(buf[:k]) {
			return
		}
	}
}

// hold delivers frame, waiting as long as the driver has no buffer for
// it or reception is paused; it reports false when Close ends the wait.
func (n *VirtioNet) hold(frame []byte) bool {
	for !n.tryDeliver(frame) {
		select {
		case <-n.rxWake:
		case <-n.stop:
			return false
		}
	}
	return true
}

// tryDeliver puts frame into the next receive buffer, or drops it when
// that buffer cannot take it; it reports false when the frame must wait
// (no buffer, the driver not running, reception paused).
func (n *VirtioNet) tryDeliver(frame []byte) bool {
	n.deliverMu.Lock()
	defer n.deliverMu.Unlock()
	if n.paused {
		return false
	}
	n.rxFrame, n.rxPlaced = frame, false
	err := n.transport.Deliver(netRxQueue, n.fillRxFn)
	n.rxFrame = nil
	if errors.Is(err, ErrQueueNotRunning) {
		return false
	}
	return n.rxPlaced // an interrupt that failed to trigger leaves the frame delivered
}

// fillPending is the Deliver callback for rxFrame.
func (n *VirtioNet) fillPending(vq *Virtqueue, _ uint64) bool {
	used, done := n.fillRx(vq, n.rxFrame)
	n.rxPlaced = done
	return used
}

// fillRx takes the next receive chain for frame. It reports whether a
// chain went to the used ring and whether the frame is done with
// (delivered, or dropped: a chain that cannot take it goes back with 0
// bytes written, so the driver sees an error and reposts its buffer).
func (n *VirtioNet) fillRx(vq *Virtqueue, frame []byte) (used, done bool) {
	head, ok, err := vq.Pop()
	if err != nil {
		n.rxDrops.Add(1)
		return false, true
	}
	if !ok {
		return false, false
	}
	var written uint32
	n.rxChain, err = vq.AppendChain(n.rxChain, head)
	if err == nil {
		written, err = rxFill(n.mem, n.rxChain, frame)
	}
	if err != nil {
		n.rxDrops.Add(1)
		written = 0
	} else {
		n.rxFrames.Add(1)
	}
	return vq.PushUsed(head, written) == nil, true
}

// rxFill writes a header (no offload, num_buffers 1 as virtio 1.x wants
// without mergeable buffers) and frame into chain and returns the bytes
// written. The chain must be device-writable and hold both.
func rxFill(mem *memory.Memory, chain []Desc, frame []byte) (uint32, error) {
	var hdr [NetHeaderSize]byte
	binary.LittleEndian.PutUint16(hdr[10:], 1)
	var room uint64
	for _, d := range chain {
		if !d.Write {
			return 0, fmt.Errorf("%w: a device-readable buffer in a receive chain", errBadFrame)
		}
		room += uint64(d.Len)
	}
	need := uint64(NetHeaderSize + len(frame))
	if room < need {
		return 0, fmt.Errorf("%w: a %d-byte frame does not fit %d bytes of receive buffers", errBadFrame, len(frame), room)
	}
	src := [2][]byte{hdr[:], frame}
	part := 0
	for _, d := range chain {
		at, left := d.Addr, uint64(d.Len)
		for left > 0 && part < len(src) {
			k := min(left, uint64(len(src[part])))
			if err := mem.Write(at, src[part][:k]); err != nil {
				return 0, fmt.Errorf("%w: %w", errBadFrame, err)
			}
			src[part] = src[part][k:]
			if len(src[part]) == 0 {
				part++
			}
			at += memory.GPA(k)
			left -= k
		}
	}
	return uint32(need), nil
}

// Pause holds reception: once it returns the device writes nothing into
// guest memory until Resume (a migration's final copy; transmission needs
// the driver's notifications and stops with the vCPUs). A frame read
// meanwhile is held, later ones wait in the backend.
func (n *VirtioNet) Pause() {
	n.deliverMu.Lock()
	n.paused = true
	n.deliverMu.Unlock()
}

// Resume lets reception go on after Pause.
func (n *VirtioNet) Resume() {
	n.deliverMu.Lock()
	n.paused = false
	n.deliverMu.Unlock()
	n.wake()
}

// Stats returns the frame counters.
func (n *VirtioNet) Stats() NetStats {
	return NetStats{TxFrames: n.txFrames.Load(), TxDropped: n.txDropped.Load(), RxFrames: n.rxFrames.Load(), RxDropped: n.rxDrops.Load()}
}

// Close stops the receive goroutine and the transport's queue workers and
// waits for them, and closes the backend; it returns the backend's close
// error and any error that had ended reception before. Closing twice is a
// no-op.
func (n *VirtioNet) Close() error {
	n.closeOnce.Do(func() {
		close(n.stop)
		n.cancel()
		errs := []error{n.backend.Close()}
		<-n.rxDone
		errs = append(errs, n.transport.Close())
		if err := n.rxErr.Load(); err != nil {
			errs = append(errs, *err)
		}
		n.closeErr = errors.Join(errs...)
	})
	return n.closeErr
}
