package devices

import (
	"bytes"
	"context"
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
