package migration

import (
	"errors"
	"reflect"
	"testing"

	"tern/vmm/devices"
)

// TestDeviceVersionsListsEveryKindThisTernSends pins the kinds and
// versions the API publishes (GET /v1/version's devices).
func TestDeviceVersionsListsEveryKindThisTernSends(t *testing.T) {
	want := map[string][]uint16{}
	for _, k := range []string{"vcpu", "clock", "uart", "serial-history", "boot-timer", "virtio-blk", "virtio-net", "irqchip", "pit"} {
		want[k] = []uint16{1}
	}
	if got := DeviceVersions(); !reflect.DeepEqual(got, want) {
		t.Fatalf("DeviceVersions() = %v, want %v", got, want)
	}
}

// TestRefusedDeviceStateMapsToTheProtocolsErrors: what the VM refuses
// reaches the peer as the code of the protocol's sentinel.
func TestRefusedDeviceStateMapsToTheProtocolsErrors(t *testing.T) {
	other := errors.New("KVM refused")
	for _, c := range []struct {
		err  error
		want error
		code uint16
	}{
		{devices.ErrUnknownState, ErrUnknownDevice, codeUnknownDevice},
		{devices.ErrMalformedState, ErrMalformed, codeInternal},
		{devices.ErrStateMismatch, ErrIncompatible, codeIncompatible},
		{other, other, codeInternal},
	} {
		got := classifyStateError(c.err)
		if !errors.Is(got, c.want) || !errors.Is(got, c.err) || codeOf(got) != c.code {
			t.Errorf("%v: got %v (code %d), want %v (code %d)", c.err, got, codeOf(got), c.want, c.code)
		}
	}
}
