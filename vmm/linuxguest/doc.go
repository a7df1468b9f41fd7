// Package linuxguest builds the Linux guest tern ships for its users and
// its tests: Debian's stock kernel (the package the emulated test host
// boots, internal/kvmhost) as its bzImage, and an initramfs assembled from
// Debian packages, never installed: busybox-static (its applets as
// symbolic links), e2fsprogs with the shared libraries and dynamic loader
// its programs need, taken from the downloaded libc6, libext2fs2 and
// friends (resolved by DT_NEEDED inside the unpacked packages, not on the
// host), and the kernel's virtio-mmio, virtio-blk, virtio-net and ext4
// modules with everything they depend on.
//
// The only hand-written part is /init (init.sh), a busybox sh script: it
// mounts proc, sysfs, devtmpfs and a tmpfs /tmp, loads the modules in
// dependency order (naming each that fails, ModuleFailedPrefix), prints
// ReadyLine, and runs a shell on the console with the prompt Prompt. When
// that shell exits, its status goes to tern's debug-exit port 0xf4, which
// ends the VM's Run with it, and then `poweroff -f`.
//
// Build fetches and assembles once per kernel package and recipe into a
// cache directory (under a lock file, so concurrent builds fetch once) and
// returns the cached paths afterwards.
package linuxguest
