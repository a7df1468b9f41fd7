package instance

import (
	"sync"

	"tern/vmm/devices"
)

// consoleHistoryBytes bounds the console history an instance keeps.
const consoleHistoryBytes = 1 << 20

// consolePump copies one machine's serial output into the instance's
// console history, which outlives the machine (a reboot builds a new one),
// so offsets keep growing across reboots. Its goroutine is the owner
// goroutine's: stop ends it and waits.
type consolePump struct {
	quit chan struct{}
	wg   sync.WaitGroup
}

// startConsolePump starts copying from to into.
func startConsolePump(from, into *devices.History) *consolePump {
	return startConsolePumpAt(from, into, 0)
}

// startConsolePumpAt starts copying from's bytes from offset on to into.
func startConsolePumpAt(from, into *devices.History, offset uint64) *consolePump {
	p := &consolePump{quit: make(chan struct{})}
	sub := from.Subscribe()
	p.wg.Go(func() {
		defer sub.Close()
		off := offset
		copyOut := func() {
			for {
				data, _, next, err := from.ReadFrom(off, 64<<10)
				if err != nil || len(data) == 0 {
					return
				}
				into.Write(data)
				off = next
			}
		}
		for {
			copyOut()
			select {
			case <-sub.C():
			case <-p.quit:
				copyOut() // what the guest printed last
				return
			}
		}
	})
	return p
}

// stop copies what is left and waits for the goroutine to end.
func (p *consolePump) stop() {
	close(p.quit)
	p.wg.Wait()
}
