package devices

import "time"

// UARTState is the UART's guest-visible state as plain data, for
// migration.
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

// HistoryState is a History's retained bytes and their absolute end.
type HistoryState struct {
	// End is the absolute offset one past the newest byte.
	End uint64
	// Data are the retained bytes, ending at End.
	Data []byte
}

// State captures the retained bytes and the end offset.
func (h *History) State() HistoryState {
	start, end := h.Bounds()
	data, _, _, _ := h.ReadFrom(start, int(end-start))
	return HistoryState{End: end, Data: data}
}

// Restore replaces the history with s, keeping the newest capacity bytes,
// so that offsets continue where the sender's left off; subscribers are
// woken.
func (h *History) Restore(s HistoryState) {
	data := s.Data
	if uint64(len(data)) > s.End {
		data = data[uint64(len(data))-s.End:]
	}
	h.mu.Lock()
	h.end = s.End - uint64(len(data))
	clear(h.ring)
	h.mu.Unlock()
	h.Write(data)
}

// BootTimerState is whether the guest wrote its magic and when.
type BootTimerState struct {
	Done    bool
	Elapsed time.Duration
}

// State captures the boot timer.
func (b *BootTimer) State() BootTimerState {
	e, ok := b.Elapsed()
	return BootTimerState{Done: ok, Elapsed: e}
}

// Restore marks the timer done with the sender's elapsed time, unless s
// is not done or this timer already is.
func (b *BootTimer) Restore(s BootTimerState) {
	if !s.Done {
		return
	}
	b.once.Do(func() {
		b.elapsed = s.Elapsed
		close(b.done)
	})
}
