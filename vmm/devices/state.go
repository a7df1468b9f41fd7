package devices

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Stateful is a device whose guest-visible state moves with a live
// migration. The device encodes that state itself and loads it back from
// those bytes, so whoever carries it (package migration) holds it as an
// opaque entry — kind, version, bytes — and learns nothing of devices:
// adding a device, or a field to one, touches only the device's file.
//
// The version travels beside the bytes, not inside them: SaveState
// writes StateVersion, and RestoreState reads that version and the one
// before it (ReadsStateVersion), so a tern one release behind can still
// send to this one. A receiver refuses any other version with
// ErrUnknownState before it touches the device, and payloads that do not
// decode with ErrMalformedState; RestoreState decodes the whole payload
// before it changes anything.
//
// Call SaveState and RestoreState with no vCPU running (a paused VM, or
// one built for a migration and not yet run).
type Stateful interface {
	// StateKind names the state's encoding, for example "uart"; two
	// devices of one kind encode their state alike.
	StateKind() string
	// StateVersion is the version of the encoding SaveState writes.
	StateVersion() uint16
	// SaveState returns the device's state, encoded.
	SaveState() ([]byte, error)
	// RestoreState loads a state of the given version SaveState of a
	// device of the same kind returned.
	RestoreState(version uint16, b []byte) error
}

// Kinds of the state of this package's devices, as they appear on the
// migration wire.
const (
	UARTStateKind      = "uart"
	HistoryStateKind   = "serial-history"
	BootTimerStateKind = "boot-timer"
	VirtioBlkStateKind = "virtio-blk"
	VirtioNetStateKind = "virtio-net"
)

// Errors of RestoreState (and of package vmm's own state entries); test
// with errors.Is.
var (
	// ErrUnknownState: a state of a kind or version this tern does not
	// read.
	ErrUnknownState = errors.New("unknown device state")
	// ErrMalformedState: a payload that does not decode as its kind and
	// version say.
	ErrMalformedState = errors.New("malformed device state")
	// ErrStateMismatch: a well-formed state that does not fit this
	// device (another queue count, rings outside this memory).
	ErrStateMismatch = errors.New("device state does not fit this device")
)

// StateVersions returns, for the kind of every Stateful device of this
// package, the version its SaveState writes.
func StateVersions() map[string]uint16 {
	return map[string]uint16{
		UARTStateKind:      uartStateVersion,
		HistoryStateKind:   historyStateVersion,
		BootTimerStateKind: bootTimerStateVersion,
		VirtioBlkStateKind: virtioMMIOStateVersion,
		VirtioNetStateKind: virtioMMIOStateVersion,
	}
}

// ReadsStateVersions returns the versions a device writing version
// current reads, lowest first: current and the one before it (there is
// none before 1).
func ReadsStateVersions(current uint16) []uint16 {
	if current > 1 {
		return []uint16{current - 1, current}
	}
	return []uint16{current}
}

// CheckStateVersion returns ErrUnknownState unless a device of kind
// writing version current reads version.
func CheckStateVersion(kind string, current, version uint16) error {
	if version == current || version != 0 && version+1 == current {
		return nil
	}
	return fmt.Errorf("%w: %s version %d (this tern reads %v)", ErrUnknownState, kind, version, ReadsStateVersions(current))
}

// stateWriter appends a state's little-endian fields.
type stateWriter struct{ b []byte }

func (w *stateWriter) u8(v uint8)   { w.b = append(w.b, v) }
func (w *stateWriter) u16(v uint16) { w.b = binary.LittleEndian.AppendUint16(w.b, v) }
func (w *stateWriter) u32(v uint32) { w.b = binary.LittleEndian.AppendUint32(w.b, v) }
func (w *stateWriter) u64(v uint64) { w.b = binary.LittleEndian.AppendUint64(w.b, v) }

func (w *stateWriter) bool(v bool) {
	if v {
		w.u8(1)
	} else {
		w.u8(0)
	}
}

// bytes32 appends p after its length.
func (w *stateWriter) bytes32(p []byte) {
	w.u32(uint32(len(p)))
	w.b = append(w.b, p...)
}

// stateReader reads what a stateWriter wrote, keeping the first error:
// once it has one, every read returns zero.
type stateReader struct {
	b   []byte
	err error
}

func (r *stateReader) take(n int) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || n > len(r.b) {
		r.err = fmt.Errorf("need %d bytes, %d left", n, len(r.b))
		return nil
	}
	p := r.b[:n:n]
	r.b = r.b[n:]
	return p
}

func (r *stateReader) u8() uint8 {
	if p := r.take(1); p != nil {
		return p[0]
	}
	return 0
}

func (r *stateReader) u16() uint16 {
	if p := r.take(2); p != nil {
		return binary.LittleEndian.Uint16(p)
	}
	return 0
}

func (r *stateReader) u32() uint32 {
	if p := r.take(4); p != nil {
		return binary.LittleEndian.Uint32(p)
	}
	return 0
}

func (r *stateReader) u64() uint64 {
	if p := r.take(8); p != nil {
		return binary.LittleEndian.Uint64(p)
	}
	return 0
}

// bool reads a byte: any value but 0 is true, as the first tern wrote
// and read it.
func (r *stateReader) bool() bool { return r.u8() != 0 }

// bytes32 reads a length, at most max, and that many bytes (a copy).
func (r *stateReader) bytes32(max int) []byte {
	n := r.u32()
	if r.err == nil && uint64(n) > uint64(max) {
		r.err = fmt.Errorf("%d bytes, at most %d", n, max)
	}
	return append([]byte(nil), r.take(int(n))...)
}

// fail records err unless an error is already kept.
func (r *stateReader) fail(err error) {
	if r.err == nil {
		r.err = err
	}
}

// finish returns the first error, or one for trailing bytes, as
// ErrMalformedState of kind.
func (r *stateReader) finish(kind string) error {
	if r.err == nil && len(r.b) > 0 {
		r.err = fmt.Errorf("%d trailing bytes", len(r.b))
	}
	if r.err != nil {
		return fmt.Errorf("decoding %s state: %w: %w", kind, ErrMalformedState, r.err)
	}
	return nil
}

// The devices whose state migrates.
var (
	_ Stateful = (*UART)(nil)
	_ Stateful = (*History)(nil)
	_ Stateful = (*BootTimer)(nil)
	_ Stateful = (*VirtioMMIO)(nil)
)
