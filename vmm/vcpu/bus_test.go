package vcpu

import (
	"bytes"
	"strings"
	"testing"
)

// recorder is a device that records accesses and reads back a fixed byte.
type recorder struct {
	got []string
}

func (r *recorder) ReadPort(port uint16, data []byte) {
	r.got = append(r.got, "r"+string(rune('0'+port%10)))
	for i := range data {
		data[i] = 0x5a
	}
}
func (r *recorder) WritePort(port uint16, data []byte) {
	r.got = append(r.got, "w"+string(rune('0'+port%10)))
}
func (r *recorder) ReadMMIO(off uint64, data []byte) {
	r.got = append(r.got, "R"+string(rune('0'+off)))
	for i := range data {
		data[i] = 0xa5
	}
}
func (r *recorder) WriteMMIO(off uint64, data []byte) {
	r.got = append(r.got, "W"+string(rune('0'+off)))
}

func TestPortBusRejectsOverlapsAndDispatches(t *testing.T) {
	var b PortBus
	uart, exit := &recorder{}, &recorder{}
	if err := b.Register("uart", 0x3f8, 8, uart); err != nil {
		t.Fatal(err)
	}
	if err := b.Register("exit", 0xf4, 1, exit); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		base, n uint16
	}{{0x3ff, 1}, {0x3f0, 9}, {0x3fa, 2}, {0xf4, 1}} {
		err := b.Register("other", c.base, c.n, &recorder{})
		if err == nil || !strings.Contains(err.Error(), "overlaps") {
			t.Errorf("Register(%#x, %d) = %v, want an overlap error", c.base, c.n, err)
		}
	}
	if err := b.Register("empty", 0x60, 0, &recorder{}); err == nil {
		t.Error("an empty range was accepted")
	}
	if err := b.Register("wrap", 0xffff, 2, &recorder{}); err == nil {
		t.Error("a range past port 0xffff was accepted")
	}
	d := []byte{0}
	b.Read(0x3fd, d)
	b.Write(0xf4, d)
	if d[0] != 0x5a || len(uart.got) != 1 || uart.got[0] != "r1" || len(exit.got) != 1 {
		t.Errorf("dispatch: data %#x uart %q exit %q", d[0], uart.got, exit.got)
	}
	un := []byte{0, 0}
	b.Read(0x60, un)
	if !bytes.Equal(un, []byte{0xff, 0xff}) {
		t.Errorf("unclaimed port read %#x, want all ones", un)
	}
	b.Write(0x60, un) // dropped, no panic
}

func TestMMIOBusPassesOffsets(t *testing.T) {
	var b MMIOBus
	dev := &recorder{}
	if err := b.Register("dev", 0xfeb00000, 0x200, dev); err != nil {
		t.Fatal(err)
	}
	if err := b.Register("other", 0xfeb001ff, 0x10, dev); err == nil {
		t.Error("an overlapping window was accepted")
	}
	d := make([]byte, 4)
	b.Read(0xfeb00004, d)
	b.Write(0xfeb00003, d[:1])
	if len(dev.got) != 2 || dev.got[0] != "R4" || dev.got[1] != "W3" || d[0] != 0xa5 {
		t.Errorf("dispatch %q data %#x", dev.got, d)
	}
	b.Read(0xfeb001fe, d) // straddles the end: unclaimed
	if !bytes.Equal(d, make([]byte, 4)) {
		t.Errorf("straddling read %#x, want zeros", d)
	}
}
