package migration

import (
	"fmt"

	"tern/vmm/devices"
)

// kindVirtioNet is a network card's virtio-mmio transport. The card's
// receive side is paused with the VM (vmm.VM.Pause) before it is
// captured, so the rings in guest memory match the registers; a frame
// the source held for a buffer is not carried (a frame lost on the wire).
const kindVirtioNet = "virtio-net"

// virtioNetState is network card Card's transport registers.
type virtioNetState struct {
	Card  uint16
	State devices.VirtioMMIOState
}

// encodeVirtioNet encodes a card's transport registers as a disk's are.
func encodeVirtioNet(v virtioNetState) DeviceState {
	return DeviceState{Kind: kindVirtioNet, Version: 1, Payload: encodeVirtioMMIO(v.Card, v.State)}
}

func decodeVirtioNet(_ uint16, p []byte) (any, error) {
	card, s, err := decodeVirtioMMIO(p)
	if err != nil {
		return nil, err
	}
	return virtioNetState{Card: card, State: s}, nil
}

// virtioNetApplier loads a card's transport state into the target's card
// of the same index.
func (t *target) virtioNetApplier(v virtioNetState) (func() error, error) {
	nics := t.vm.VirtioNets()
	if int(v.Card) >= len(nics) {
		return nil, fmt.Errorf("applying device state: %w: the source has network card %d, this VM %d cards", ErrIncompatible, v.Card, len(nics))
	}
	tr := nics[v.Card].Transport()
	return func() error {
		if err := tr.SetState(v.State); err != nil {
			return fmt.Errorf("applying device state: %w: %w", ErrIncompatible, err)
		}
		return nil
	}, nil
}
