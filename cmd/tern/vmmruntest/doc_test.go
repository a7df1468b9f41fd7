// Package vmmruntest holds the black-box tests of `tern vmm run`: they
// build tern, run it as a user would, and boot real KVM guests, here or
// inside the emulated test host (kvmtest). They live apart from
// cmd/tern's own tests so that only they enter the emulated host.
package vmmruntest
