package kvm

import (
	"errors"
	"os"
	"testing"
)

// TestProbe runs the probe where /dev/kvm exists; without it Probe must
// say so through an error that wraps os.ErrNotExist.
func TestProbe(t *testing.T) {
	err := Probe()
	if _, statErr := os.Stat(DevicePath); errors.Is(statErr, os.ErrNotExist) {
		if !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("Probe without %s = %v, want a not-exist error", DevicePath, err)
		}
		return
	}
	t.Logf("Probe = %v", err)
}
