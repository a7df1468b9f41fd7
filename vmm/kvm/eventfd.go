package kvm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// EventFD is a Linux eventfd: a 64-bit counter that Signal adds to and
// Read takes and resets. KVM signals one for a guest write it matches
// (an ioeventfd) and consumes one to raise an interrupt line (an irqfd).
//
// The fd is non-blocking and wrapped in an *os.File, so a Read waits in
// Go's netpoller rather than in a blocked thread, and Close wakes a Read
// in progress (it returns an error wrapping os.ErrClosed). Signal, Read
// and Close may be called from any goroutine.
type EventFD struct {
	// Immutable after NewEventFD.
	f *os.File
	// fd is f's descriptor, kept apart because (*os.File).Fd would put
	// the fd back into blocking mode. Valid until Close.
	fd int
}

// NewEventFD creates an eventfd with a zero counter (EFD_CLOEXEC |
// EFD_NONBLOCK).
func NewEventFD() (*EventFD, error) {
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("creating eventfd: %w", err)
	}
	// os.NewFile sees the fd is non-blocking and registers it with the
	// poller.
	return &EventFD{f: os.NewFile(uintptr(fd), "eventfd"), fd: fd}, nil
}

// Fd returns the descriptor to hand to KVM (AssignIRQFD, IOEventFD.FD).
// It is valid until Close; the EventFD keeps owning it.
func (e *EventFD) Fd() int { return e.fd }

// Signal adds 1 to the counter, waking a Read.
func (e *EventFD) Signal() error {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], 1)
	if _, err := e.f.Write(b[:]); err != nil {
		return fmt.Errorf("signalling eventfd: %w", err)
	}
	return nil
}

// Read waits until the counter is non-zero, then returns it and resets
// it to zero. After Close (or during it) it returns an error wrapping
// os.ErrClosed.
func (e *EventFD) Read() (uint64, error) {
	var b [8]byte
	if _, err := e.f.Read(b[:]); err != nil {
		return 0, fmt.Errorf("reading eventfd: %w", err)
	}
	return binary.LittleEndian.Uint64(b[:]), nil
}

// Close closes the eventfd, waking a Read in progress. Closing twice is
// a no-op.
func (e *EventFD) Close() error {
	if err := e.f.Close(); err != nil && !errors.Is(err, os.ErrClosed) {
		return fmt.Errorf("closing eventfd: %w", err)
	}
	return nil
}
