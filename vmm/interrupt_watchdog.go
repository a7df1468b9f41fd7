package vmm

import (
	"context"
	"fmt"
	"log/slog"
	"time"
)

// A Linux guest's devices interrupt on edge-triggered lines, and an edge
// can be lost on its way: one that meets a masked or busy pin of the
// irqchip is gone, and the driver then waits for good for a completion
// (or a transmit slot) it is never told of. The devices know when that
// happened: a virtio transport's InterruptStatus, or a UART condition the
// driver enabled, stands unserved long after the interrupt was raised,
// though a driver serves both in its handler. The watchdog looks once a
// tick, while the vCPUs run, and raises such an interrupt again; a guest
// that was merely slow gets one handler call that finds nothing to do.
const (
	interruptWatchTick  = time.Second
	interruptStaleAfter = 2 * time.Second
)

// rearmer is a device the watchdog watches (devices.VirtioMMIO,
// devices.UART).
type rearmer interface {
	RaiseUnacknowledged(after time.Duration) (bool, error)
}

// startInterruptWatchdog starts the watchdog over the UART and every
// virtio transport of a Linux guest; Close stops it before the devices.
func (vm *VM) startInterruptWatchdog() {
	watched := map[string]rearmer{"UART": vm.uart}
	for i, t := range vm.virtioBlks {
		watched["virtio-blk "+diskName(i)] = t
	}
	for j, n := range vm.nics {
		watched[fmt.Sprintf("virtio-net %d", j)] = n.Transport()
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	vm.stopWatchdog = func() { cancel(); <-done }
	go func() {
		defer close(done)
		tick := time.NewTicker(interruptWatchTick)
		defer tick.Stop()
		raised := map[string]int{}
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			if !vm.guestRunning() {
				continue // a parked guest handles nothing; its devices wait
			}
			for name, d := range watched {
				ok, err := d.RaiseUnacknowledged(interruptStaleAfter)
				if !ok {
					continue
				}
				raised[name]++
				vm.log.Warn("interrupt unacknowledged: raised again", slog.String("device", name),
					slog.Int("times", raised[name]), slog.Any("err", err))
			}
		}
	}()
}
