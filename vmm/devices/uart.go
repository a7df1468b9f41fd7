package devices

import (
	"sync"
	"time"
)

// UARTBase is the COM1 port base.
const UARTBase = 0x3f8

// Register offsets from the base and bits of the 8250 UART.
const (
	uartRBRTHR = 0 // receive buffer / transmit holding; DLL with DLAB
	uartIER    = 1 // interrupt enable; DLM with DLAB
	uartIIRFCR = 2 // interrupt identification (read) / FIFO control (write)
	uartLCR    = 3
	uartMCR    = 4
	uartLSR    = 5
	uartMSR    = 6
	uartSCR    = 7

	lcrDLAB = 0x80

	ierRDA  = 0x01 // received data available
	ierTHRE = 0x02 // transmit holding register empty

	iirNone = 0x01
	iirTHRE = 0x02
	iirRDA  = 0x04
	iirFIFO = 0xc0

	lsrDR   = 0x01
	lsrTHRE = 0x20
	lsrTEMT = 0x40

	mcrLoop = 0x10

	// msrIdle is CTS | DSR | DCD: a connected, idle line.
	msrIdle = 0xb0
)

// uartInputMax bounds the input queue; input beyond it is dropped.
const uartInputMax = 64 << 10

// UART is an 8250 UART with its transmitter wired to a History and its
// receiver fed by Input. Transmission is instantaneous (LSR always reports
// THRE and TEMT).
type UART struct {
	// Immutable after construction.
	out *History
	irq Interrupt

	mu sync.Mutex
	// ier, lcr, mcr, scr, dll and dlm are the registers of those names.
	ier, lcr, mcr, scr, dll, dlm uint8
	// fifo reports whether the guest enabled the FIFOs (FCR bit 0).
	fifo bool
	// threPending is the THRE interrupt's condition: set by a THR write
	// or by enabling it, cleared by reading IIR while it is reported.
	threPending bool
	// input is the receive queue; input[0] is in RBR.
	input []byte
	// raisedAt is when the interrupt was last raised (RaiseUnacknowledged).
	raisedAt time.Time
}

// NewUART returns a UART writing transmitted bytes to out and raising irq
// (which may be NoInterrupt{}) per its IER.
func NewUART(out *History, irq Interrupt) *UART {
	return &UART{out: out, irq: irq, dll: 1}
}

// Output returns the history the UART transmits into.
func (u *UART) Output() *History { return u.out }

// Input queues bytes for the guest to receive and returns how many were
// accepted (the queue is bounded).
func (u *UART) Input(p []byte) int {
	u.mu.Lock()
	n := min(len(p), uartInputMax-len(u.input))
	u.input = append(u.input, p[:n]...)
	raise := n > 0 && u.ier&ierRDA != 0
	if raise {
		u.raisedAt = time.Now()
	}
	u.mu.Unlock()
	if raise {
		u.irq.Trigger()
	}
	return n
}

// ReadPort handles a read of one of the UART's eight ports.
func (u *UART) ReadPort(port uint16, data []byte) {
	if len(data) == 0 {
		return
	}
	u.mu.Lock()
	data[0] = u.readLocked(port - UARTBase)
	u.mu.Unlock()
	clear(data[1:])
}

func (u *UART) readLocked(reg uint16) uint8 {
	dlab := u.lcr&lcrDLAB != 0
	switch reg {
	case uartRBRTHR:
		if dlab {
			return u.dll
		}
		if len(u.input) == 0 {
			return 0
		}
		b := u.input[0]
		u.input = u.input[1:]
		return b
	case uartIER:
		if dlab {
			return u.dlm
		}
		return u.ier
	case uartIIRFCR:
		var fifo uint8
		if u.fifo {
			fifo = iirFIFO
		}
		switch {
		case u.ier&ierRDA != 0 && len(u.input) > 0:
			return iirRDA | fifo
		case u.ier&ierTHRE != 0 && u.threPending:
			u.threPending = false
			return iirTHRE | fifo
		}
		return iirNone | fifo
	case uartLCR:
		return u.lcr
	case uartMCR:
		return u.mcr
	case uartLSR:
		lsr := uint8(lsrTHRE | lsrTEMT)
		if len(u.input) > 0 {
			lsr |= lsrDR
		}
		return lsr
	case uartMSR:
		if u.mcr&mcrLoop != 0 {
			// Loopback: DTR->DSR, RTS->CTS, OUT1->RI, OUT2->DCD.
			m := u.mcr
			return (m&1)<<5 | (m&2)<<3 | (m&4)<<4 | (m&8)<<4
		}
		return msrIdle
	case uartSCR:
		return u.scr
	}
	return 0
}

// WritePort handles a write to one of the UART's eight ports.
func (u *UART) WritePort(port uint16, data []byte) {
	if len(data) == 0 {
		return
	}
	v := data[0]
	u.mu.Lock()
	var tx, raise bool
	dlab := u.lcr&lcrDLAB != 0
	switch port - UARTBase {
	case uartRBRTHR:
		if dlab {
			u.dll = v
			break
		}
		if u.mcr&mcrLoop != 0 {
			u.input = append(u.input, v)
			raise = u.ier&ierRDA != 0
			break
		}
		tx = true
		u.threPending = true
		raise = u.ier&ierTHRE != 0
	case uartIER:
		if dlab {
			u.dlm = v
			break
		}
		if v&ierTHRE != 0 && u.ier&ierTHRE == 0 {
			u.threPending = true // the holding register is already empty
			raise = true
		}
		// Bytes that arrived while receive interrupts were off interrupt
		// as soon as they are enabled, as a 16550's level line would.
		if v&ierRDA != 0 && u.ier&ierRDA == 0 && len(u.input) > 0 {
			raise = true
		}
		u.ier = v & 0x0f
	case uartIIRFCR:
		u.fifo = v&1 != 0
		if v&2 != 0 { // clear the receive FIFO
			u.input = nil
		}
	case uartLCR:
		u.lcr = v
	case uartMCR:
		u.mcr = v & 0x1f
	case uartSCR:
		u.scr = v
	}
	if raise {
		u.raisedAt = time.Now()
	}
	u.mu.Unlock()
	if tx {
		u.out.Write([]byte{v})
	}
	if raise {
		u.irq.Trigger()
	}
}

// RaiseUnacknowledged raises the interrupt again when an enabled
// condition (received data, or an empty holding register the driver asked
// to hear of) has stood unserved for at least after since the interrupt
// was last raised, and reports whether it did. A 16550's line stays
// asserted while such a condition holds; this one pulses an
// edge-triggered line per event, so an edge lost on the way would leave
// the driver waiting to transmit, or input unread, for good. The VM calls
// it from a watchdog for interrupt-driven guests.
func (u *UART) RaiseUnacknowledged(after time.Duration) (bool, error) {
	u.mu.Lock()
	pending := u.ier&ierRDA != 0 && len(u.input) > 0 || u.ier&ierTHRE != 0 && u.threPending
	stale := pending && time.Since(u.raisedAt) >= after
	if stale {
		u.raisedAt = time.Now()
	}
	u.mu.Unlock()
	if !stale {
		return false, nil
	}
	return true, u.irq.Trigger()
}
