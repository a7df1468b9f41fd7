package main

import (
	"testing"
)

// TestBenchStartRefusesInsideTheEmulatedTestHost runs tern bench start as
// the emulated test host's init would run it: it exits 1, saying why.
func TestBenchStartRefusesInsideTheEmulatedTestHost(t *testing.T) {
	wantBenchRefusedInside(t, "bench", "start", "--runs", "1")
}
