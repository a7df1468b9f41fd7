package devices

import "time"

// bootTimerStateVersion is the version of the boot timer's state
// SaveState writes: done (one byte), then the elapsed nanoseconds
// (uint64).
const bootTimerStateVersion = 1

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

// StateKind returns BootTimerStateKind.
func (b *BootTimer) StateKind() string { return BootTimerStateKind }

// StateVersion returns the version SaveState writes.
func (b *BootTimer) StateVersion() uint16 { return bootTimerStateVersion }

// SaveState returns the timer's state, encoded.
func (b *BootTimer) SaveState() ([]byte, error) {
	s := b.State()
	w := &stateWriter{}
	w.bool(s.Done)
	w.u64(uint64(s.Elapsed))
	return w.b, nil
}

// RestoreState loads an encoded state (Restore).
func (b *BootTimer) RestoreState(version uint16, p []byte) error {
	s, err := decodeBootTimerState(version, p)
	if err != nil {
		return err
	}
	b.Restore(s)
	return nil
}

func decodeBootTimerState(version uint16, p []byte) (BootTimerState, error) {
	if err := CheckStateVersion(BootTimerStateKind, bootTimerStateVersion, version); err != nil {
		return BootTimerState{}, err
	}
	r := &stateReader{b: p}
	s := BootTimerState{Done: r.bool(), Elapsed: time.Duration(r.u64())}
	if err := r.finish(BootTimerStateKind); err != nil {
		return BootTimerState{}, err
	}
	return s, nil
}
