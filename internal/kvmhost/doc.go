// Package kvmhost runs a program inside the emulated KVM test host: Debian's
// own kernel booted under QEMU with software emulation (TCG, one vCPU,
// 6 GiB) on a CPU model that offers AMD-V, so that its kvm and kvm-amd
// modules give a real /dev/kvm on a machine that has none. Its command,
// tools/kvmhost/cmd/kvmhost, is `go test -exec`-able. The library lives
// under internal/ rather than beside its command in tools/ because tern
// itself uses it (`tern up` runs the vmm inside the emulated host where
// /dev/kvm is not usable, and benchmarks refuse to measure in there).
//
// How a run works:
//
//  1. The kernel package that linux-image-amd64 depends on is fetched once
//     with `apt-get download`, unpacked with `dpkg-deb -x` in a scratch
//     directory (never installed), and reduced to what the cache keeps: the
//     ELF vmlinux extracted from the bzImage's XZ payload (QEMU boots it
//     through its PVH note, about twice as fast as the bzImage) and a cpio
//     archive of kvm, kvm-amd and their dependencies in load order, read
//     from each module's depends= modinfo field.
//  2. Each run writes an initramfs: the cached modules archive followed by
//     a second archive with /init (the running executable itself), the
//     binary, the shared libraries either links against (PT_INTERP and
//     DT_NEEDED, recursively), the --file paths, the working directory's
//     testdata and a JSON run spec.
//  3. Inside, /init (RunInit, when IsInit) mounts proc, sys, devtmpfs and
//     a tmpfs /tmp, brings up lo, loads the modules, opens /dev/kvm (with
//     Options.Network: gives eth0, an e1000 on QEMU user networking,
//     GuestAddr/24, from which HostAddr is the host's loopback), runs
//     the binary in the host's working-directory path with its stdout on
//     ttyS0 and stderr on ttyS1 (raw: bytes pass unchanged), drains both,
//     prints the exit status on the console (ttyS2, which also carries the
//     kernel's few messages) and powers off.
//  4. The host streams ttyS0 and ttyS1 to its stdout and stderr as they
//     arrive and returns the reported status.
//
// Invariants: QEMU never outlives Exec (killed by pid on timeout, on
// SIGINT/SIGTERM and on cancellation; Pdeathsig if the process dies); the
// binary's output is never mixed with the console, so its status cannot be
// forged by what it prints; the cache is filled under a lock file so that
// concurrent test binaries fetch once.
//
// Benchmarks must not report figures measured in here: RefuseBenchmark.
package kvmhost
