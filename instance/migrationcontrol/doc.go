// Package migrationcontrol holds the control experiment of
// docs/reliability.md (issue 34): it tells tern's failures of migrated
// Linux guests from the emulated test host's own, by running the same
// guest under the same emulator with another VMM.
//
// Its two tests, TestControlQEMU and TestControlTern, run only when
// ControlEnv names a number of migrations; each boots in the emulated test host (internal/kvmhost, two emulated CPUs,
// whatever /dev/kvm this machine has) Debian's kernel with tern's
// userland (vmm/linuxguest) on two vCPUs and 384 MiB, keeps both vCPUs
// busy with a shell loop pinned to each and a third loop writing 1 MiB
// blocks of random data to its virtio-blk disk (a file) and reading each
// back past the page cache, and migrates it that many times, twice:
//
//   - with QEMU (qemu-system-x86_64 -accel kvm -cpu host, the microvm
//     machine, the same kernel, initramfs and command line), QEMU to QEMU
//     with -incoming, driven over QMP, alternating tcp on loopback (the
//     network hop) and a unix socket (the same-host hop);
//   - with tern, `tern vmm serve` processes and `tern migrate`,
//     alternating QUIC and same-host (memfd) hops.
//
// After each migration the guest must answer on its console, show both
// CPUs online, make a new disk pass with every block read back as
// written, and have logged no oops, soft lockup, stall or panic. A guest
// failure (a triple fault or other crash, a console that stopped, a bad
// kernel line, a disk mismatch) ends that guest: its signature (tern's
// crash report, QEMU's shutdown reason, the console's last lines) is
// logged, a fresh guest boots, and migrations go on until the number
// asked for were attempted. The test fails only when the experiment
// cannot be made (a VMM that does not start, a guest that never boots);
// the counts are its result, printed as `control:` lines. A panic or a
// stall of the emulated host itself ends the run (kvmhost boots it once
// more and the test starts again, printed as a retry): count from the
// log. QEMUBandwidthEnv gives QEMU tern's migration rate in there.
//
//	TERN_CONTROL_MIGRATIONS=10 go test -count=1 -v -timeout 150m -run '^TestControlQEMU$' ./instance/migrationcontrol
//	TERN_CONTROL_MIGRATIONS=10 go test -count=1 -v -timeout 150m -run '^TestControlTern$' ./instance/migrationcontrol
package migrationcontrol
