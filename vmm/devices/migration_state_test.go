package devices

import (
	"bytes"
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
