#!/bin/sh
# /init of tern's Linux userland (package vmm/linuxguest): the one
# hand-written file of an initramfs otherwise taken from Debian's
# packages. It runs under busybox sh, with the console (the /dev/console
# node of the archive) on stdin, stdout and stderr.
export PATH=/sbin:/usr/sbin:/bin:/usr/bin HOME=/root
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /tmp

# The modules, dependencies first, as written by the build: a module that
# fails is named, and the rest still load.
release=$(uname -r)
dir=/lib/modules/$release
if [ -r "$dir/order" ]; then
	while read -r m; do
		insmod "$dir/$m.ko" || echo "tern-linux: module failed: $m"
	done <"$dir/order"
else
	echo "tern-linux: no modules for kernel $release"
fi

# Kernel messages would land in the middle of the shell's lines.
dmesg -n 1
echo "tern-linux: ready"

# A shell on the console, which cttyhack makes its controlling terminal
# (job control, ^C); setsid does not fork here, since init leads no
# process group, so init waits for the shell.
PS1='tern-linux# ' setsid cttyhack sh
status=$?

# The shell's status to tern's debug-exit port (0xf4), which ends tern's
# Run with it; elsewhere (QEMU) a forced power-off ends the machine.
sync
printf "\\$(printf %03o "$((status & 255))")" | dd of=/dev/port bs=1 seek=244 count=1 conv=notrunc 2>/dev/null
poweroff -f
echo "tern-linux: poweroff failed; halting"
while :; do sleep 3600; done
