package kvmhost

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"

	"tern/vmm/kvm"
)

// CheckResult is one line of `kvmhost check`.
type CheckResult struct {
	// What is checked: "/dev/kvm" or "emulated host".
	What string
	// OK is whether it is usable.
	OK bool
	// Detail says what was found, or exactly why not.
	Detail string
}

// String renders "WHAT: yes (DETAIL)" or "WHAT: no: DETAIL".
func (r CheckResult) String() string {
	if r.OK {
		return fmt.Sprintf("%s: yes (%s)", r.What, r.Detail)
	}
	return fmt.Sprintf("%s: no: %s", r.What, r.Detail)
}

// CheckKVM probes /dev/kvm with kvm.Probe.
func CheckKVM() CheckResult {
	if err := kvm.Probe(); err != nil {
		return CheckResult{What: "/dev/kvm", Detail: err.Error()}
	}
	return CheckResult{What: "/dev/kvm", OK: true, Detail: "opened, KVM_CREATE_VM, one vCPU ran to HLT"}
}

// CheckEmulatedHost reports whether the emulated host can boot here: the
// kernel cached or fetchable, QEMU present, and SVM among the CPU flags
// its TCG offers. It fetches nothing.
func CheckEmulatedHost(ctx context.Context) CheckResult {
	r := CheckResult{What: "emulated host"}
	qemu, err := exec.LookPath(qemuBinary)
	if err != nil {
		r.Detail = qemuBinary + " not found in PATH (install qemu-system-x86)"
		return r
	}
	out, err := exec.CommandContext(ctx, qemu, "-accel", "tcg", "-cpu", "help").CombinedOutput()
	if err != nil {
		r.Detail = fmt.Sprintf("running %s -cpu help: %v: %s", qemuBinary, err, lastLine(out))
		return r
	}
	if !hasCPUFlag(string(out), "svm") {
		r.Detail = qemuBinary + " offers no svm CPU flag: its TCG cannot give the guest AMD-V"
		return r
	}
	cache, err := CacheDir()
	if err != nil {
		r.Detail = err.Error()
		return r
	}
	pkg, err := KernelPackage(ctx)
	if err != nil {
		r.Detail = err.Error()
		return r
	}
	kernel := "kernel " + pkg + " cached"
	if _, ok := CachedKernel(cache, pkg); !ok {
		out, err := exec.CommandContext(ctx, "apt-get", "download", "--print-uris", pkg).CombinedOutput()
		if err != nil || !strings.Contains(string(out), ".deb") {
			r.Detail = fmt.Sprintf("kernel %s is not cached in %s and apt-get cannot fetch it: %s", pkg, cache, lastLine(out))
			return r
		}
		kernel = "kernel " + pkg + " fetchable with apt-get download"
	}
	r.OK = true
	r.Detail = fmt.Sprintf("%s, %s, svm among the CPU flags its -cpu max offers", kernel, qemu)
	ver, _ := exec.CommandContext(ctx, qemu, "--version").Output()
	if major, version, ok := qemuVersion(string(ver)); ok {
		r.Detail += ", QEMU " + version
		if major < minQEMUMajor {
			r.Detail += fmt.Sprintf(" (older than %d: under 7.2 Linux guests in the emulated host triple-faulted during boot and locked up a CPU after a same-host migration; .ci/run installs %d)", minQEMUMajor, minQEMUMajor)
		}
	}
	return r
}

// minQEMUMajor is the oldest QEMU whose TCG ran the emulated host's
// Linux guests without fault (see .ci/run).
const minQEMUMajor = 10

// qemuVersion parses `qemu-system-x86_64 --version`: its major version
// and the whole version string.
func qemuVersion(out string) (major int, version string, ok bool) {
	rest, found := strings.CutPrefix(strings.TrimSpace(out), "QEMU emulator version ")
	if !found {
		return 0, "", false
	}
	version, _, _ = strings.Cut(rest, " ")
	version = strings.TrimSpace(strings.SplitN(version, "\n", 2)[0])
	if _, err := fmt.Sscanf(version, "%d", &major); err != nil {
		return 0, "", false
	}
	return major, version, true
}

// hasCPUFlag reports whether `-cpu help` lists flag among its CPUID flags.
func hasCPUFlag(help, flag string) bool {
	_, flags, ok := strings.Cut(help, "Recognized CPUID flags:")
	if !ok {
		return false
	}
	for _, f := range strings.Fields(flags) {
		if f == flag {
			return true
		}
	}
	return false
}

// Check prints both lines to stdout and returns whether either is usable.
func Check(ctx context.Context) bool {
	k, e := CheckKVM(), CheckEmulatedHost(ctx)
	fmt.Fprintln(os.Stdout, k)
	fmt.Fprintln(os.Stdout, e)
	return k.OK || e.OK
}
