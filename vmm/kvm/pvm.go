package kvm

import "os"

// pvmModuleDir is kvm-pvm's directory in sysfs; the module is built into
// the kernels that have it, so the directory exists whether or not it
// bound /dev/kvm.
const pvmModuleDir = "/sys/module/kvm_pvm"

// PVM reports whether this kernel's KVM is kvm-pvm's, the paravirtual
// KVM that runs inside a guest. Its /dev/kvm may pass Probe, but it runs
// every guest at hardware CPL3 and emulates a guest's own CPL0 code
// instruction by instruction: tern's test guests, which do their work at
// CPL3, run at native speed, while a stock Linux kernel, which is
// nearly all CPL0 code, is far too slow to boot (it prints its banner
// after tens of seconds and stops at an instruction PVM does not
// emulate). So where a caller needs Linux to boot, a usable /dev/kvm with
// PVM true is not enough.
func PVM() bool {
	_, err := os.Stat(pvmModuleDir)
	return err == nil
}
