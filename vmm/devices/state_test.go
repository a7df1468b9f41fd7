package devices

import (
	"bytes"
	"context"
	"errors"
	"reflect"
	"testing"
	"time"
)

func TestUARTStateMovesToAnotherUART(t *testing.T) {
	a := NewUART(NewHistory(64), NoInterrupt{})
	a.WritePort(UARTBase+uartLCR, []byte{0x83})
	a.WritePort(UARTBase+uartRBRTHR, []byte{7}) // DLL with DLAB
	a.WritePort(UARTBase+uartLCR, []byte{0x03})
	a.WritePort(UARTBase+uartSCR, []byte{0x5a})
	a.Input([]byte("hi"))
	b := NewUART(NewHistory(64), NoInterrupt{})
	b.SetState(a.State())
	if !reflect.DeepEqual(a.State(), b.State()) {
		t.Fatalf("state %+v, want %+v", b.State(), a.State())
	}
	got := make([]byte, 1)
	b.ReadPort(UARTBase+uartRBRTHR, got)
	if got[0] != 'h' {
		t.Fatalf("RBR %q", got)
	}
}

func TestHistoryRestoreContinuesTheSendersOffsets(t *testing.T) {
	a := NewHistory(8)
	a.Write([]byte("0123456789abc"))
	b := NewHistory(8)
	b.Restore(a.State())
	if s, e := b.Bounds(); s != 5 || e != 13 {
		t.Fatalf("bounds %d, %d", s, e)
	}
	b.Write([]byte("d"))
	data, first, _, _ := b.ReadFrom(0, 100)
	if first != 6 || !bytes.Equal(data, []byte("6789abcd")) {
		t.Fatalf("read %q from %d", data, first)
	}
}

func TestBootTimerRestore(t *testing.T) {
	b := NewBootTimer(time.Now(), nil)
	b.Restore(BootTimerState{Done: true, Elapsed: 42 * time.Millisecond})
	if e, ok := b.Elapsed(); !ok || e != 42*time.Millisecond {
		t.Fatalf("elapsed %v %v", e, ok)
	}
}

// TestVirtioMMIOStateMovesToAnotherTransport: a driver set up and used on
// one transport goes on, on another that loaded its state over the same
// guest memory, with the queue resuming at the used ring's index.
func TestVirtioMMIOStateMovesToAnotherTransport(t *testing.T) {
	d := newTestDriver(t, 512, 1<<20)
	d.setUp(FeatureVersion1 | FeatureFlush)
	want := pattern(4096, 3)
	if st := d.write(16, want); st != BlkStatusOK {
		t.Fatalf("write status %d", st)
	}
	st := d.dev.State()
	moved := NewVirtioMMIO(context.Background(), d.dev.dev, d.mem, d.irq)
	if err := moved.SetState(st); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(moved.State(), st) {
		t.Fatalf("state %+v, want %+v", moved.State(), st)
	}
	d.dev = moved
	got, status, _ := d.read(16, 4096)
	if status != BlkStatusOK || !bytes.Equal(got, want) {
		t.Fatalf("read on the new transport: status %d, data equal %v", status, bytes.Equal(got, want))
	}
	bad := st
	bad.Queues = append(bad.Queues, VirtioQueueState{})
	if err := moved.SetState(bad); err == nil {
		t.Fatal("a state with another queue count loaded")
	}
	if moved.Status() != 0 {
		t.Fatalf("a refused state left status %d; want reset", moved.Status())
	}
}

// TestStateBytesAreTheMigrationWireFormat pins the encodings to the bytes
// a tern of migration protocol version 1 sends, so a tern reading its
// state from the device keeps speaking to one that does not.
func TestStateBytesAreTheMigrationWireFormat(t *testing.T) {
	u := NewUART(NewHistory(64), NoInterrupt{})
	u.SetState(UARTState{IER: 1, LCR: 3, MCR: 3, SCR: 0x5a, DLL: 1, FIFO: true, Input: []byte("ab")})
	h := NewHistory(64)
	h.Restore(HistoryState{End: 5, Data: []byte("hello")})
	b := NewBootTimer(time.Now(), nil)
	b.Restore(BootTimerState{Done: true, Elapsed: time.Second})
	for _, c := range []struct {
		dev  Stateful
		want []byte
	}{
		{u, []byte{1, 3, 3, 0x5a, 1, 0, 1, 0, 2, 0, 0, 0, 'a', 'b'}},
		{h, []byte{5, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 'h', 'e', 'l', 'l', 'o'}},
		{b, []byte{1, 0x00, 0xca, 0x9a, 0x3b, 0, 0, 0, 0}},
	} {
		got, err := c.dev.SaveState()
		if err != nil || !bytes.Equal(got, c.want) || c.dev.StateVersion() != 1 {
			t.Errorf("%s: version %d, % x, %v; want version 1, % x", c.dev.StateKind(), c.dev.StateVersion(), got, err, c.want)
		}
	}
}

// TestEveryDeviceStateMovesThroughItsBytes: each Stateful device's saved
// bytes restore, on a fresh device of its kind, the state it had.
func TestEveryDeviceStateMovesThroughItsBytes(t *testing.T) {
	u := NewUART(NewHistory(64), NoInterrupt{})
	u.SetState(UARTState{LCR: 3, MCR: 1, FIFO: true, THREPending: true, Input: []byte("x")})
	h := NewHistory(64)
	h.Write([]byte("booted\n"))
	b := NewBootTimer(time.Now(), nil)
	b.Restore(BootTimerState{Done: true, Elapsed: 7 * time.Millisecond})
	d := newTestDriver(t, 512, 1<<20)
	d.setUp(FeatureVersion1 | FeatureFlush)
	for _, c := range []struct {
		from, to Stateful
		state    func(Stateful) any
	}{
		{u, NewUART(NewHistory(64), NoInterrupt{}), func(s Stateful) any { return s.(*UART).State() }},
		{h, NewHistory(64), func(s Stateful) any { return s.(*History).State() }},
		{b, NewBootTimer(time.Now(), nil), func(s Stateful) any { return s.(*BootTimer).State() }},
		{d.dev, NewVirtioMMIO(context.Background(), d.dev.dev, d.mem, d.irq), func(s Stateful) any { return s.(*VirtioMMIO).State() }},
	} {
		p, err := c.from.SaveState()
		if err != nil {
			t.Fatalf("%s: %v", c.from.StateKind(), err)
		}
		if err := c.to.RestoreState(c.from.StateVersion(), p); err != nil {
			t.Fatalf("%s: %v", c.from.StateKind(), err)
		}
		if got, want := c.state(c.to), c.state(c.from); !reflect.DeepEqual(got, want) {
			t.Errorf("%s: restored %+v, want %+v", c.from.StateKind(), got, want)
		}
	}
	if k := d.dev.StateKind(); k != VirtioBlkStateKind {
		t.Errorf("a disk's transport has state kind %q", k)
	}
}

// TestRestoreStateRefusesWhatItCannotRead: another version is
// ErrUnknownState, bytes that do not decode ErrMalformedState, and a
// transport state of another queue count ErrStateMismatch.
func TestRestoreStateRefusesWhatItCannotRead(t *testing.T) {
	u := NewUART(NewHistory(64), NoInterrupt{})
	good, _ := u.SaveState()
	if err := u.RestoreState(2, good); !errors.Is(err, ErrUnknownState) {
		t.Errorf("version 2: %v, want ErrUnknownState", err)
	}
	if err := u.RestoreState(0, good); !errors.Is(err, ErrUnknownState) {
		t.Errorf("version 0: %v, want ErrUnknownState", err)
	}
	if err := u.RestoreState(1, append(good, 0)); !errors.Is(err, ErrMalformedState) {
		t.Errorf("a trailing byte: %v, want ErrMalformedState", err)
	}
	h := NewHistory(64)
	bad := []byte{2, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 'a', 'b', 'c'} // 3 bytes ending at 2
	if err := h.RestoreState(1, bad); !errors.Is(err, ErrMalformedState) {
		t.Errorf("more history than its end offset: %v, want ErrMalformedState", err)
	}
	d := newTestDriver(t, 512, 1<<20)
	p, err := d.dev.SaveState()
	if err != nil {
		t.Fatal(err)
	}
	p[4*4+8+4] = 2                          // the queue count, after the registers: one more than a disk has
	p = append(p, make([]byte, 2+1+3*8)...) // a second queue, not ready
	if err := d.dev.RestoreState(1, p); !errors.Is(err, ErrStateMismatch) {
		t.Errorf("a state of two queues on a disk of one: %v, want ErrStateMismatch", err)
	}
}

// FuzzRestoreState feeds arbitrary bytes of any version to every Stateful
// device: a payload from the network may be refused but must never panic
// the VMM, nor leave a device that panics on its next access.
func FuzzRestoreState(f *testing.F) {
	d := newTestDriver(f, 512, 64<<10)
	d.setUp(FeatureVersion1 | FeatureFlush)
	u := NewUART(NewHistory(64), NoInterrupt{})
	u.Input([]byte("q"))
	h := NewHistory(64)
	h.Write([]byte("abc"))
	devs := []Stateful{u, h, NewBootTimer(time.Now(), nil), d.dev}
	for i, dev := range devs {
		p, err := dev.SaveState()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(uint8(i), dev.StateVersion(), p)
	}
	f.Fuzz(func(t *testing.T, which uint8, version uint16, p []byte) {
		dev := devs[int(which)%len(devs)]
		if dev.RestoreState(version, p) == nil {
			if _, err := dev.SaveState(); err != nil {
				t.Fatalf("%s: saving a restored state: %v", dev.StateKind(), err)
			}
		}
	})
}
