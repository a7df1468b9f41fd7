package instance

import (
	"runtime"

	"tern/vmm/kvm"
)

// ProbeHost asks the host's KVM how many vCPUs one VM may have
// (KVM_CAP_MAX_VCPUS, else KVM_CAP_NR_VCPUS, else the API's default of
// 4), bounded by the host's CPUs: one VM never has more vCPUs than the
// host can run at once. Without a usable /dev/kvm it returns a Host that skips the check,
// and the error; instances then fail when their VM is built.
func ProbeHost() (Host, error) {
	sys, err := kvm.Open()
	if err != nil {
		return Host{}, err
	}
	defer sys.Close()
	for _, c := range []kvm.Capability{kvm.CapMaxVCPUs, kvm.CapNrVCPUs} {
		n, err := sys.CheckExtension(c)
		if err != nil {
			return Host{}, err
		}
		if n > 0 {
			return Host{MaxVCPUs: min(n, runtime.NumCPU())}, nil
		}
	}
	return Host{MaxVCPUs: min(4, runtime.NumCPU())}, nil
}
