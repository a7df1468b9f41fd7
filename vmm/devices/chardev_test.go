package devices

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

type countingIRQ struct{ n atomic.Int32 }

func (c *countingIRQ) Trigger() error { c.n.Add(1); return nil }

func TestHistoryKeepsAbsoluteOffsetsAndDropsTheOldest(t *testing.T) {
	h := NewHistory(8)
	h.Write([]byte("hello, "))
	h.Write([]byte("world"))
	if start, end := h.Bounds(); start != 4 || end != 12 {
		t.Fatalf("bounds [%d, %d), want [4, 12)", start, end)
	}
	data, first, next, err := h.ReadFrom(0, 100)
	if err != nil || string(data) != "o, world" || first != 4 || next != 12 {
		t.Errorf("ReadFrom(0) = %q first %d next %d %v; want the retained bytes from 4", data, first, next, err)
	}
	data, first, next, _ = h.ReadFrom(7, 3)
	if string(data) != "wor" || first != 7 || next != 10 {
		t.Errorf("ReadFrom(7, 3) = %q %d %d", data, first, next)
	}
	if _, _, _, err := h.ReadFrom(13, 1); !errors.Is(err, ErrOffsetAhead) {
		t.Errorf("reading ahead: %v", err)
	}
	h.Write([]byte("0123456789abcdef")) // longer than the capacity
	if data, first, _, _ := h.ReadFrom(0, 100); string(data) != "89abcdef" || first != 20 {
		t.Errorf("after an oversized write: %q from %d", data, first)
	}
}

func TestHistorySubscribersNeverBlockTheWriter(t *testing.T) {
	h := NewHistory(1024)
	sub := h.Subscribe()
	defer sub.Close()
	done := make(chan struct{})
	go func() {
		for range 10000 { // nobody reads the subscription meanwhile
			h.Write([]byte("x"))
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("writer blocked on an idle subscriber")
	}
	select {
	case <-sub.C():
	default:
		t.Fatal("subscriber not woken")
	}
	if _, end := h.Bounds(); end != 10000 {
		t.Errorf("end %d", end)
	}
}

func uartWrite(u *UART, reg uint16, v byte) { u.WritePort(UARTBase+reg, []byte{v}) }
func uartRead(u *UART, reg uint16) byte {
	b := []byte{0xee}
	u.ReadPort(UARTBase+reg, b)
	return b[0]
}

func TestUARTTransmitsToHistoryAndHonoursDLAB(t *testing.T) {
	irq := &countingIRQ{}
	u := NewUART(NewHistory(64), irq)
	uartWrite(u, uartLCR, 0x83) // DLAB on
	uartWrite(u, uartRBRTHR, 0x01)
	uartWrite(u, uartIER, 0x00)
	if uartRead(u, uartRBRTHR) != 0x01 || uartRead(u, uartIER) != 0 {
		t.Error("divisor latch not readable under DLAB")
	}
	uartWrite(u, uartLCR, 0x03)
	for _, c := range []byte("hi\n") {
		if uartRead(u, uartLSR)&lsrTHRE == 0 {
			t.Fatal("THRE clear: guests would spin")
		}
		uartWrite(u, uartRBRTHR, c)
	}
	if data, _, _, _ := u.Output().ReadFrom(0, 10); string(data) != "hi\n" {
		t.Errorf("output %q, want only the bytes written with DLAB off", data)
	}
	uartWrite(u, uartSCR, 0x5a)
	if uartRead(u, uartSCR) != 0x5a || uartRead(u, uartLCR) != 0x03 {
		t.Error("SCR or LCR not read back")
	}
	if uartRead(u, uartMSR) != msrIdle || uartRead(u, uartIIRFCR) != iirNone {
		t.Error("MSR or IIR not idle")
	}
	if irq.n.Load() != 0 {
		t.Error("interrupt raised with IER zero")
	}
	// THRE interrupt: enabling it reports THRE once in IIR.
	uartWrite(u, uartIER, ierTHRE)
	if irq.n.Load() != 1 || uartRead(u, uartIIRFCR) != iirTHRE || uartRead(u, uartIIRFCR) != iirNone {
		t.Error("THRE interrupt not raised and reported once")
	}
}

func TestUARTInputReachesRBRWithDataReady(t *testing.T) {
	irq := &countingIRQ{}
	u := NewUART(NewHistory(64), irq)
	if uartRead(u, uartLSR)&lsrDR != 0 {
		t.Fatal("data ready with no input")
	}
	uartWrite(u, uartIER, ierRDA)
	if n := u.Input([]byte("ok")); n != 2 {
		t.Fatalf("accepted %d", n)
	}
	if irq.n.Load() != 1 || uartRead(u, uartIIRFCR)&0x0f != iirRDA {
		t.Error("receive interrupt not raised or not reported")
	}
	var got []byte
	for uartRead(u, uartLSR)&lsrDR != 0 {
		got = append(got, uartRead(u, uartRBRTHR))
	}
	if string(got) != "ok" || uartRead(u, uartIIRFCR) != iirNone {
		t.Errorf("received %q", got)
	}
	// Loopback mode returns transmitted bytes to the receiver.
	uartWrite(u, uartMCR, mcrLoop|0x0f)
	uartWrite(u, uartRBRTHR, 'L')
	if uartRead(u, uartRBRTHR) != 'L' || uartRead(u, uartMSR) != 0xf0 {
		t.Error("loopback")
	}
	if _, end := u.Output().Bounds(); end != 0 {
		t.Error("loopback byte transmitted")
	}
}

// A byte that arrives while receive interrupts are off interrupts when the
// driver turns them on: Linux's 8250 driver enables them only when the
// tty opens, and waits for that interrupt to read what came before.
func TestUARTInputBeforeReceiveInterruptsInterruptsWhenEnabled(t *testing.T) {
	irq := &countingIRQ{}
	u := NewUART(NewHistory(64), irq)
	u.Input([]byte("x"))
	if irq.n.Load() != 0 {
		t.Fatalf("%d interrupts with receive interrupts off", irq.n.Load())
	}
	uartWrite(u, uartIER, ierRDA)
	if irq.n.Load() != 1 || uartRead(u, uartIIRFCR)&0x0f != iirRDA {
		t.Fatalf("enabling receive interrupts with a byte waiting: %d interrupts, IIR %#x; want 1 and RDA", irq.n.Load(), uartRead(u, uartIIRFCR))
	}
	uartWrite(u, uartIER, ierRDA) // already on: no new interrupt
	if irq.n.Load() != 1 {
		t.Errorf("rewriting IER raised %d interrupts in all, want 1", irq.n.Load())
	}
}

func TestDebugExitReportsTheFirstStatus(t *testing.T) {
	d := NewDebugExit()
	if _, ok := d.Status(); ok {
		t.Fatal("status before any write")
	}
	d.WritePort(DebugExitPort, []byte{3, 1, 0, 0})
	d.WritePort(DebugExitPort, []byte{0})
	<-d.Done()
	if s, ok := d.Status(); !ok || s != 0x103 {
		t.Errorf("status %#x %v, want the first write's value", s, ok)
	}
}

func TestBootTimerRecordsTheMagicWrite(t *testing.T) {
	start := time.Unix(1000, 0)
	now := start
	b := NewBootTimer(start, func() time.Time { return now })
	now = start.Add(5 * time.Millisecond)
	b.WriteMMIO(0, []byte{122})
	b.WriteMMIO(1, []byte{BootTimerMagic})
	if _, ok := b.Elapsed(); ok {
		t.Fatal("recorded a wrong value or offset")
	}
	now = start.Add(7 * time.Millisecond)
	b.WriteMMIO(0, []byte{BootTimerMagic})
	now = start.Add(time.Second)
	b.WriteMMIO(0, []byte{BootTimerMagic})
	<-b.Done()
	if d, _ := b.Elapsed(); d != 7*time.Millisecond {
		t.Errorf("elapsed %v, want 7ms from the first magic write", d)
	}
}

func TestPowerRecordsTheFirstPowerOffOrReset(t *testing.T) {
	for _, c := range []struct {
		name   string
		writes [][2]uint16 // port, value
		want   PowerEvent
	}{
		{"S5 with SLP_EN", [][2]uint16{{SleepStatusPort, 0x80}, {SleepControlPort, SleepTypeS5<<2 | 1<<5}}, PowerOff},
		{"S5 without SLP_EN", [][2]uint16{{SleepControlPort, SleepTypeS5 << 2}}, PowerNone},
		{"another sleep type", [][2]uint16{{SleepControlPort, 3<<2 | 1<<5}}, PowerNone},
		{"reset", [][2]uint16{{ResetPort, ResetValue}}, PowerReset},
		{"a wrong reset value", [][2]uint16{{ResetPort, 0xfe}}, PowerNone},
		{"the keyboard controller's pulse reset", [][2]uint16{{KeyboardCommandPort, KeyboardResetCommand}}, PowerReset},
		{"another keyboard controller command", [][2]uint16{{KeyboardCommandPort, 0xad}}, PowerNone},
		{"reset then power off", [][2]uint16{{ResetPort, ResetValue}, {SleepControlPort, SleepTypeS5<<2 | 1<<5}}, PowerReset},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := NewPower()
			ended := false
			for _, w := range c.writes {
				if p.Write(w[0], []byte{byte(w[1])}) {
					ended = true
				}
			}
			if got := p.Event(); got != c.want {
				t.Fatalf("event %v, want %v", got, c.want)
			}
			select {
			case <-p.Done():
				if c.want == PowerNone {
					t.Fatal("Done closed with no event")
				}
			default:
				if c.want != PowerNone {
					t.Fatal("Done open after the event")
				}
			}
			if ended != (c.want != PowerNone) {
				t.Fatalf("Write reported an end %v, want %v", ended, c.want != PowerNone)
			}
			buf := []byte{0xff}
			p.ReadPort(SleepStatusPort, buf)
			if buf[0] != 0 {
				t.Fatalf("sleep status reads %#x, want 0 (no wake event)", buf[0])
			}
		})
	}
}

func TestUARTRaisesAgainOnlyWhatStandsUnserved(t *testing.T) {
	irq := &countingIRQ{}
	u := NewUART(NewHistory(64), irq)
	if ok, _ := u.RaiseUnacknowledged(0); ok {
		t.Fatal("raised again with nothing enabled")
	}
	uartWrite(u, uartIER, ierTHRE) // the driver wants to transmit
	if ok, _ := u.RaiseUnacknowledged(time.Hour); ok || irq.n.Load() != 1 {
		t.Fatalf("raised again before the interval: %d interrupts in all, want 1", irq.n.Load())
	}
	if ok, _ := u.RaiseUnacknowledged(0); !ok || irq.n.Load() != 2 {
		t.Fatalf("an unserved THRE was not raised again: %d interrupts in all, want 2", irq.n.Load())
	}
	if uartRead(u, uartIIRFCR)&0x0f != iirTHRE {
		t.Fatal("IIR does not report THRE")
	}
	if ok, _ := u.RaiseUnacknowledged(0); ok {
		t.Fatal("raised again after the driver read IIR")
	}
	uartWrite(u, uartIER, ierRDA)
	u.Input([]byte("xy"))
	uartRead(u, uartRBRTHR)
	if ok, _ := u.RaiseUnacknowledged(0); !ok {
		t.Fatal("a byte left unread was not raised again")
	}
	uartRead(u, uartRBRTHR)
	if ok, _ := u.RaiseUnacknowledged(0); ok {
		t.Fatal("raised again with the input read")
	}
}
