package main

import (
	"io"

	"tern/vmm/devices"
)

// serialCopier copies a guest's serial output to a writer as it arrives,
// from a goroutine it owns; stop ends it after copying everything written
// so far. A slow writer never holds up the guest: the history only drops
// its oldest bytes.
type serialCopier struct {
	h    *devices.History
	w    io.Writer
	sub  *devices.Subscription
	quit chan struct{}
	done chan struct{}
}

func newSerialCopier(h *devices.History, w io.Writer) *serialCopier {
	c := &serialCopier{h: h, w: w, sub: h.Subscribe(), quit: make(chan struct{}), done: make(chan struct{})}
	go c.run()
	return c
}

func (c *serialCopier) run() {
	defer close(c.done)
	var off uint64
	for {
		off = c.copyFrom(off)
		select {
		case <-c.sub.C():
		case <-c.quit:
			c.copyFrom(off)
			return
		}
	}
}

// copyFrom writes everything from off and returns the new offset.
func (c *serialCopier) copyFrom(off uint64) uint64 {
	for {
		data, _, next, err := c.h.ReadFrom(off, 64<<10)
		if err != nil || len(data) == 0 {
			return off
		}
		c.w.Write(data) // a closed stdout must not stop the guest
		off = next
	}
}

// stop copies what is left and ends the goroutine.
func (c *serialCopier) stop() {
	close(c.quit)
	<-c.done
	c.sub.Close()
}
