package devices

// uartStateVersion is the version of the UART state SaveState writes:
// IER, LCR, MCR, SCR, DLL, DLM, FIFO and THRE-pending as one byte each,
// then the receive queue's length (uint32) and bytes.
const uartStateVersion = 1

// UARTState is the UART's guest-visible state as plain data.
type UARTState struct {
	IER, LCR, MCR, SCR, DLL, DLM uint8
	FIFO, THREPending            bool
	// Input is the receive queue, Input[0] in RBR.
	Input []byte
}

// State captures the UART's registers and receive queue.
func (u *UART) State() UARTState {
	u.mu.Lock()
	defer u.mu.Unlock()
	return UARTState{
		IER: u.ier, LCR: u.lcr, MCR: u.mcr, SCR: u.scr, DLL: u.dll, DLM: u.dlm,
		FIFO: u.fifo, THREPending: u.threPending, Input: append([]byte(nil), u.input...),
	}
}

// SetState loads s into the UART (the input queue is cut at its bound).
func (u *UART) SetState(s UARTState) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.ier, u.lcr, u.mcr, u.scr, u.dll, u.dlm = s.IER&0x0f, s.LCR, s.MCR&0x1f, s.SCR, s.DLL, s.DLM
	u.fifo, u.threPending = s.FIFO, s.THREPending
	u.input = append([]byte(nil), s.Input[:min(len(s.Input), uartInputMax)]...)
}

// Reassert pulses the UART's interrupt line if an interrupt it enables is
// pending (received data, or the transmit holding register's empty
// event): after SetState on a migration target, so a pending condition
// is served even if the edge that announced it was consumed on the source
// without the guest having run its handler. A pulse with nothing new is a
// spurious interrupt the guest's driver reads IIR for and ignores.
func (u *UART) Reassert() {
	u.mu.Lock()
	pending := u.ier&ierRDA != 0 && len(u.input) > 0 || u.ier&ierTHRE != 0 && u.threPending
	u.mu.Unlock()
	if pending {
		u.irq.Trigger()
	}
}

// StateKind returns UARTStateKind.
func (u *UART) StateKind() string { return UARTStateKind }

// StateVersion returns the version SaveState writes.
func (u *UART) StateVersion() uint16 { return uartStateVersion }

// SaveState returns the registers and receive queue, encoded. The serial
// output (Output) is a Stateful of its own.
func (u *UART) SaveState() ([]byte, error) { return encodeUARTState(u.State()), nil }

// RestoreState loads an encoded state (SetState) and reasserts a pending
// interrupt (Reassert).
func (u *UART) RestoreState(version uint16, b []byte) error {
	s, err := decodeUARTState(version, b)
	if err != nil {
		return err
	}
	u.SetState(s)
	u.Reassert()
	return nil
}

func encodeUARTState(s UARTState) []byte {
	w := &stateWriter{}
	for _, v := range []uint8{s.IER, s.LCR, s.MCR, s.SCR, s.DLL, s.DLM} {
		w.u8(v)
	}
	w.bool(s.FIFO)
	w.bool(s.THREPending)
	w.bytes32(s.Input)
	return w.b
}

// decodeUARTState reads an encoded UART state of version (this tern
// writes the only one there is).
func decodeUARTState(version uint16, b []byte) (UARTState, error) {
	if err := CheckStateVersion(UARTStateKind, uartStateVersion, version); err != nil {
		return UARTState{}, err
	}
	r := &stateReader{b: b}
	var s UARTState
	s.IER, s.LCR, s.MCR, s.SCR, s.DLL, s.DLM = r.u8(), r.u8(), r.u8(), r.u8(), r.u8(), r.u8()
	s.FIFO, s.THREPending = r.bool(), r.bool()
	s.Input = r.bytes32(uartInputMax)
	if err := r.finish(UARTStateKind); err != nil {
		return UARTState{}, err
	}
	return s, nil
}
