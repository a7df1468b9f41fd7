package devices

import "fmt"

// historyStateVersion is the version of the history state SaveState
// writes: the end offset (uint64), then the retained bytes' length
// (uint32) and bytes.
const historyStateVersion = 1

// maxHistoryState bounds the retained bytes of a history state read.
const maxHistoryState = 64 << 20

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

// StateKind returns HistoryStateKind.
func (h *History) StateKind() string { return HistoryStateKind }

// StateVersion returns the version SaveState writes.
func (h *History) StateVersion() uint16 { return historyStateVersion }

// SaveState returns the retained bytes and the end offset, encoded.
func (h *History) SaveState() ([]byte, error) {
	s := h.State()
	w := &stateWriter{}
	w.u64(s.End)
	w.bytes32(s.Data)
	return w.b, nil
}

// RestoreState loads an encoded state (Restore).
func (h *History) RestoreState(version uint16, b []byte) error {
	s, err := decodeHistoryState(version, b)
	if err != nil {
		return err
	}
	h.Restore(s)
	return nil
}

// decodeHistoryState reads an encoded history state of version; more
// bytes than the end offset is malformed.
func decodeHistoryState(version uint16, b []byte) (HistoryState, error) {
	if err := CheckStateVersion(HistoryStateKind, historyStateVersion, version); err != nil {
		return HistoryState{}, err
	}
	r := &stateReader{b: b}
	s := HistoryState{End: r.u64(), Data: r.bytes32(maxHistoryState)}
	if r.err == nil && uint64(len(s.Data)) > s.End {
		r.fail(fmt.Errorf("%d bytes of history ending at offset %d", len(s.Data), s.End))
	}
	if err := r.finish(HistoryStateKind); err != nil {
		return HistoryState{}, err
	}
	return s, nil
}
