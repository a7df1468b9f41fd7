package kvmhost

import (
	"errors"
	"os"
)

// InsideEmulatedHost reports whether this process runs inside the emulated
// test host: init set InsideEnv for it, or the run spec is on disk.
func InsideEmulatedHost() bool {
	if os.Getenv(InsideEnv) == "1" {
		return true
	}
	_, err := os.Stat(runSpecPath)
	return err == nil
}

// ErrBenchmarkInEmulatedHost is what a benchmark returns instead of
// figures when it runs inside the emulated test host.
var ErrBenchmarkInEmulatedHost = errors.New("refusing to report benchmark figures measured inside the emulated test host: its KVM runs on CPUs emulated in software (QEMU TCG), so timings there mean nothing; run the benchmark on a machine with a usable /dev/kvm")

// RefuseBenchmark returns ErrBenchmarkInEmulatedHost inside the emulated
// test host and nil elsewhere. VMM benchmarks call it before measuring.
func RefuseBenchmark() error {
	if InsideEmulatedHost() {
		return ErrBenchmarkInEmulatedHost
	}
	return nil
}
