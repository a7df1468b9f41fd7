// Package selftest proves that a /dev/kvm runs tern's guests: the
// machine's own, or the emulated test host's when the machine has none
// (its tests use kvm/kvmtest, so `TERN_KVMHOST=always go test` runs them
// inside the emulated host). A real-mode guest prints over port 0x3f8
// and halts; the hello test guest runs from a 64-bit entry on long-mode
// page tables from vmm/boot, with KVM_SET_CPUID2. The package has no code
// of its own beyond this doc.
package selftest
