// Package kvmtest is the one helper every test package that needs KVM
// uses, so that such tests run on any machine:
//
//	func TestMain(m *testing.M) { kvmtest.Main(m) }
//
//	func TestSomething(t *testing.T) {
//		kvmtest.Require(t)
//		…
//	}
//
// Main probes /dev/kvm with kvm.Probe (open, KVM_CREATE_VM, a vCPU run to
// HLT). Where it is usable the tests run here. Where it is not, the test
// binary re-executes itself, with the same arguments, inside the emulated
// test host (internal/kvmhost): one boot per test binary, not per test. The
// environment variable TERN_KVMHOST steers that:
//
//	(unset), auto  use /dev/kvm when usable, else the emulated host
//	always         the emulated host even where /dev/kvm works
//	never          never the emulated host: without /dev/kvm, Require
//	               skips with a message that begins "no usable /dev/kvm"
//
// Inside the emulated host the binary prints
// "kvmhost: running inside the emulated test host" once, and Require fails
// (never skips) if /dev/kvm does not work there.
//
// Tests that start tern processes pass WithTern to Main: tern is built on
// the host (`go build tern/cmd/tern`), carried in, and Tern returns its
// path in either place.
package kvmtest
