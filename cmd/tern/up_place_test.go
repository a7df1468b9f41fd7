package main

import (
	"errors"
	"strings"
	"testing"
)

// TestUpVMMPlace is where tern up runs its vmm: here when /dev/kvm is
// usable, in the emulated test host when it is not or when the guest is
// Linux and /dev/kvm is kvm-pvm's, and an error where TERN_KVMHOST=never
// forbids the emulated host that would be needed.
func TestUpVMMPlace(t *testing.T) {
	noKVM := errors.New("opening /dev/kvm: no such file or directory")
	for _, tc := range []struct {
		name     string
		mode     string // TERN_KVMHOST
		probeErr error
		pvm      bool
		linux    bool
		// emulated and wantErr are the decision; why holds whyHolds.
		emulated bool
		wantErr  bool
		whyHolds string
	}{
		{name: "kvm demo"},
		{name: "kvm linux", mode: "auto", linux: true},
		{name: "pvm demo", pvm: true},
		{name: "pvm linux", pvm: true, linux: true, emulated: true, whyHolds: "nested PVM"},
		{name: "pvm linux never", mode: "never", pvm: true, linux: true, wantErr: true, whyHolds: "nested PVM"},
		{name: "no kvm", mode: "auto", probeErr: noKVM, emulated: true, whyHolds: "no usable /dev/kvm"},
		{name: "no kvm never", mode: "never", probeErr: noKVM, pvm: true, linux: true, wantErr: true, whyHolds: "no usable /dev/kvm"},
		{name: "always", mode: "always", emulated: true, whyHolds: "TERN_KVMHOST=always"},
		{name: "bad mode", mode: "sometimes", wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			emulated, why, err := upVMMPlace(tc.mode, tc.probeErr, tc.pvm, tc.linux)
			if emulated != tc.emulated || (err != nil) != tc.wantErr || !strings.Contains(why, tc.whyHolds) {
				t.Errorf("upVMMPlace(%q, %v, pvm %v, linux %v) = %v, %q, %v; want emulated %v, why holding %q, error %v",
					tc.mode, tc.probeErr, tc.pvm, tc.linux, emulated, why, err, tc.emulated, tc.whyHolds, tc.wantErr)
			}
		})
	}
}
