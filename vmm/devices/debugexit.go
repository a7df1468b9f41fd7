package devices

import "sync"

// DebugExitPort is the port QEMU's isa-debug-exit uses and tern's guests
// write their exit status to.
const DebugExitPort = 0xf4

// DebugExit ends a VM: the guest writes its status to port 0xf4. The first
// write is reported; later writes are ignored.
type DebugExit struct {
	// Immutable after construction.
	done chan struct{}
	once sync.Once
	// status is written once, before done is closed.
	status uint32
}

// NewDebugExit returns a debug-exit device.
func NewDebugExit() *DebugExit { return &DebugExit{done: make(chan struct{})} }

// Done is closed when the guest has written its status.
func (d *DebugExit) Done() <-chan struct{} { return d.done }

// Status returns the guest's status once Done is closed.
func (d *DebugExit) Status() (uint32, bool) {
	select {
	case <-d.done:
		return d.status, true
	default:
		return 0, false
	}
}

// ReadPort reads zeros.
func (d *DebugExit) ReadPort(_ uint16, data []byte) { clear(data) }

// WritePort records the value written (1, 2 or 4 bytes, little-endian).
func (d *DebugExit) WritePort(_ uint16, data []byte) {
	d.once.Do(func() {
		d.status = uint32(littleEndian(data[:min(len(data), 4)]))
		close(d.done)
	})
}
