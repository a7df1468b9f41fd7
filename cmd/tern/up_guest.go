package main

import (
	"context"
	"fmt"
	"io"

	"tern/instance/apiv1"
	"tern/internal/kvmhost"
	"tern/vmm/linuxguest"
)

// The guests `tern up --guest` runs on its volume.
const (
	upGuestDemo  = "demo"
	upGuestLinux = "linux"
)

// upGuest is what tern up needs to know of the guest it runs: the
// instance's guest and memory, the volume's size, and the files a vmm in
// the emulated test host needs carried in.
type upGuest struct {
	// name is upGuestDemo or upGuestLinux.
	name string
	// spec and memoryMiB go into the instance's spec.
	spec      apiv1.GuestSpec
	memoryMiB uint64
	// extentCount sizes each region (upBlockSize × upExtentBlocks per
	// extent).
	extentCount uint32
	// regionPrefix starts the names of the regions' directories in the
	// data directory, so that one holds the volumes of both guests.
	regionPrefix string
	// files are carried into the emulated test host at the paths spec
	// names them by.
	files []kvmhost.File
	// emulatedCPUs is the emulated test host's CPUs when the vmm runs
	// there (0: kvmhost's default, one).
	emulatedCPUs int
}

// upDemoGuest is the built-in demo guest on a 16 MiB volume: small
// enough to reconcile at once.
var upDemoGuest = upGuest{
	name:        upGuestDemo,
	spec:        apiv1.GuestSpec{Kind: apiv1.GuestELF, Path: "demo"},
	memoryMiB:   64,
	extentCount: 16,
}

// upLinuxExtentCount gives the Linux guest a 64 MiB volume, room for
// mkfs.ext4's default layout with a journal.
const upLinuxExtentCount = 64

// upLinuxMemoryMiB is the Linux guest's memory: the kernel, the
// initramfs unpacked in its page cache and a shell's working room.
const upLinuxMemoryMiB = 256

// prepareUpGuest returns the guest called name, building the Linux one
// (Debian's kernel and tern's userland, vmm/linuxguest) into its cache
// first; it says on out that it does so.
func prepareUpGuest(ctx context.Context, name string, out io.Writer) (upGuest, error) {
	switch name {
	case upGuestDemo:
		return upDemoGuest, nil
	case upGuestLinux:
	default:
		return upGuest{}, fmt.Errorf("--guest %q: want %s or %s", name, upGuestDemo, upGuestLinux)
	}
	cache, err := linuxguest.DefaultCacheDir()
	if err != nil {
		return upGuest{}, err
	}
	fmt.Fprintf(out, "tern up: the Linux guest is Debian's kernel with a busybox and e2fsprogs userland, built from Debian packages on first use (cache: %s)\n", cache)
	f, err := linuxguest.Build(ctx, cache, out)
	if err != nil {
		return upGuest{}, fmt.Errorf("building the Linux guest: %w", err)
	}
	return upGuest{
		name:         upGuestLinux,
		spec:         apiv1.GuestSpec{Kind: apiv1.GuestLinux, Kernel: f.Kernel, Initrd: f.Initramfs, Cmdline: linuxguest.Cmdline},
		memoryMiB:    upLinuxMemoryMiB,
		extentCount:  upLinuxExtentCount,
		regionPrefix: "linux-",
		// Build's paths are absolute: the same paths inside.
		files: []kvmhost.File{{Host: f.Kernel}, {Host: f.Initramfs}},
		// With one emulated CPU the machine does nothing else while
		// Linux runs (kvmhost.CPUsEnv).
		emulatedCPUs: 2,
	}, nil
}

// region is the geometry of each of the volume's regions.
func (g upGuest) region() apiv1.RegionSpec {
	return apiv1.RegionSpec{BlockSize: upBlockSize, ExtentBlocks: upExtentBlocks, ExtentCount: g.extentCount}
}
