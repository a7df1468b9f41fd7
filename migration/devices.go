package migration

import (
	"errors"
	"fmt"

	"tern/vmm"
	"tern/vmm/devices"
)

// The VM's state travels as entries of a kind, a version and bytes
// (vmm.DeviceState): the VM saves them (vmm.VM.SaveState), each device
// encoding its own (devices.Stateful), and the target's VM loads them
// (vmm.VM.RestoreState). This package carries them without reading them;
// it only maps what the VM refuses to the protocol's errors.

// DeviceVersions returns, for every device state kind, the versions this
// tern reads, lowest first: the current one and the one before it.
func DeviceVersions() map[string][]uint16 { return vmm.DeviceStateVersions() }

// classifyStateError wraps an error of vmm.VM.RestoreState in the
// protocol's sentinel for it, which the peer receives as its code: a
// kind or version this tern does not read is ErrUnknownDevice, a payload
// that does not decode ErrMalformed, state of another VM ErrIncompatible.
func classifyStateError(err error) error {
	switch {
	case errors.Is(err, devices.ErrUnknownState):
		return fmt.Errorf("%w: %w", ErrUnknownDevice, err)
	case errors.Is(err, devices.ErrMalformedState):
		return fmt.Errorf("%w: %w", ErrMalformed, err)
	case errors.Is(err, devices.ErrStateMismatch):
		return fmt.Errorf("%w: %w", ErrIncompatible, err)
	}
	return err
}
