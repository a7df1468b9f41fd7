package devices

import (
	"sync"
	"time"
)

// BootTimerAddr is the guest-physical address of the boot-timer byte.
const BootTimerAddr = 0xC0000000

// BootTimerMagic is the value a guest writes when it is up.
const BootTimerMagic = 123

// BootTimer records the time from a start instant (the VM's creation) to
// the guest's first write of BootTimerMagic, as Firecracker's boot timer
// does.
type BootTimer struct {
	// Immutable after construction.
	start time.Time
	now   func() time.Time
	done  chan struct{}
	once  sync.Once
	// elapsed is written once, before done is closed.
	elapsed time.Duration
}

// NewBootTimer returns a boot timer measuring from start with the clock
// now (time.Now when nil).
func NewBootTimer(start time.Time, now func() time.Time) *BootTimer {
	if now == nil {
		now = time.Now
	}
	return &BootTimer{start: start, now: now, done: make(chan struct{})}
}

// Done is closed when the guest has written the magic value.
func (b *BootTimer) Done() <-chan struct{} { return b.done }

// Elapsed returns the time from start to the magic write, once Done.
func (b *BootTimer) Elapsed() (time.Duration, bool) {
	select {
	case <-b.done:
		return b.elapsed, true
	default:
		return 0, false
	}
}

// ReadMMIO reads zeros.
func (b *BootTimer) ReadMMIO(_ uint64, data []byte) { clear(data) }

// WriteMMIO records the first write of BootTimerMagic at offset 0.
func (b *BootTimer) WriteMMIO(offset uint64, data []byte) {
	if offset != 0 || len(data) == 0 || data[0] != BootTimerMagic {
		return
	}
	b.once.Do(func() {
		b.elapsed = b.now().Sub(b.start)
		close(b.done)
	})
}
