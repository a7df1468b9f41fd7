package vmm

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"tern/internal/blockio"
	"tern/vmm/acpi"
	"tern/vmm/boot"
	"tern/vmm/devices"
	"tern/vmm/guests"
	"tern/vmm/memory"
)

// ErrInvalidConfig is wrapped by every problem New finds in a Config.
var ErrInvalidConfig = errors.New("invalid VM config")

// Config describes a VM before it exists.
type Config struct {
	// Guest is a built-in guest's name (vmm/guests: hello, dirty, disk,
	// echo) or, when it contains a '/' or ends in ".elf", an ELF file's
	// path.
	Guest string
	// Linux, when set instead of Guest, boots a Linux kernel through its
	// 64-bit entry (vmm/boot.LoadLinux, LoadVmlinux): the serial console
	// is the UART at 0x3f8 (console=ttyS0), and the VM gets what
	// linux_platform.go describes. Its disks interrupt through irqfds and
	// are notified through ioeventfds (virtio_irq.go); the kernel finds
	// them in the ACPI DSDT, and needs the virtio_mmio and virtio_blk
	// modules (Debian builds them as modules).
	Linux *LinuxGuest
	// MemoryBytes is the size of guest RAM, one region at address 0. Give
	// it or Regions, not both.
	MemoryBytes uint64
	// Regions lay guest RAM out explicitly; the first must include the
	// boot area below 64 KiB and the guest's segments.
	Regions []memory.RegionSpec
	// VCPUs is the number of vCPUs (0 means 1), at most what the host's
	// KVM allows.
	VCPUs int
	// Disk, when set, backs a virtio-blk device at VirtioBlkBase: the
	// same as Disks with it alone. Give Disk or Disks, not both.
	Disk blockio.Device
	// Disks back one virtio-blk device each, Disks[i] at VirtioBlkAddr(i)
	// (vda, vdb, …), at most MaxDisks. The caller owns them and closes
	// them after the VM.
	Disks []blockio.Device
	// NICs are the network cards, virtio-net on TAP interfaces, NICs[j]
	// in slot NICSlot(j) (VirtioSlotAddr), at most MaxNICs (nics.go).
	NICs []NIC
	// Params is the built-in guests' parameter block; nil means their
	// defaults. TSCkHz and, with a disk, VirtioBase are filled in when 0.
	// Given with a guest file, it is written for that guest too.
	Params *guests.Params
	// SerialHistoryBytes bounds the serial output kept (default 1 MiB).
	SerialHistoryBytes int
	// Logger receives tern's own log lines (default: none).
	Logger *slog.Logger
}

// LinuxGuest is a Linux kernel to boot, with its initrd and command line.
type LinuxGuest struct {
	// Kernel is the path of a bzImage, or of an uncompressed ELF vmlinux
	// (entered at its ELF entry, which skips the bzImage's decompressor).
	Kernel string
	// Initrd is the initramfs's path (may be empty).
	Initrd string
	// Cmdline is the kernel command line, e.g. "console=ttyS0 panic=-1".
	Cmdline string
}

// Guest-physical layout of the devices and the boot area.
const (
	// VirtioBlkBase is the first virtio-blk device's virtio-mmio window:
	// QEMU microvm's first slot, where the disk guest also looks by
	// default. Further disks follow in the next slots (VirtioBlkAddr).
	VirtioBlkBase = 0xfeb00000
	// MaxDisks is how many virtio-blk devices a VM may have.
	MaxDisks = 8
	// BootTimerSize is the MMIO window of the boot timer.
	BootTimerSize = 0x1000
	// BootAreaEnd bounds tern's boot data (GDT, page tables, parameter
	// block, AP park, stack): guest segments must start above it.
	BootAreaEnd memory.GPA = boot.StackTopAddr
	// APParkAddr holds the HLT the application processors of tern's own
	// guests start at (a Linux guest's start where its kernel sends them).
	APParkAddr memory.GPA = 0x9000
)

// mmioWindows are the device windows RAM must not overlap.
var mmioWindows = []struct {
	name       string
	base, size uint64
}{
	{"boot timer", devices.BootTimerAddr, BootTimerSize},
	{"virtio-mmio", VirtioBlkBase, VirtioSlots * devices.MMIOSize},
}

// VirtioBlkAddr is the base of disk i's virtio-mmio window: the slots
// are devices.MMIOSize apart, as on QEMU's microvm.
func VirtioBlkAddr(i int) uint64 { return VirtioSlotAddr(i) }

// disks returns the backends of the config's disks, in slot order.
func (c *Config) disks() []blockio.Device {
	if c.Disk != nil {
		return []blockio.Device{c.Disk}
	}
	return c.Disks
}

// virtioSlotsInUse returns the virtio-mmio slots the config occupies, in
// ascending order: disk i in slot i, network card j in NICSlot(j). The
// ACPI DSDT describes these slots and no others (linux_platform.go).
func (c *Config) virtioSlotsInUse() []int {
	var slots []int
	for i := range c.disks() {
		slots = append(slots, i)
	}
	for j := range c.NICs {
		slots = append(slots, NICSlot(j))
	}
	return slots
}

// guestImage is a resolved, parsed guest.
type guestImage struct {
	builtin bool
	elf     *boot.ELFImage
	// kernel and initrd are a Linux guest's, when elf is nil; vmlinux is
	// its kernel parsed when it is an ELF file rather than a bzImage.
	kernel, initrd []byte
	vmlinux        *boot.ELFImage
}

// resolveLinux reads a Linux guest's files and parses the kernel, a
// bzImage or an ELF vmlinux.
func resolveLinux(l *LinuxGuest) (*guestImage, error) {
	if l.Kernel == "" {
		return nil, fmt.Errorf("%w: linux: no kernel given", ErrInvalidConfig)
	}
	k, err := os.ReadFile(l.Kernel)
	if err != nil {
		return nil, fmt.Errorf("%w: reading linux kernel: %w", ErrInvalidConfig, err)
	}
	img := &guestImage{kernel: k}
	if bytes.HasPrefix(k, []byte("\x7fELF")) {
		if img.vmlinux, err = boot.ParseELF(k); err != nil {
			return nil, fmt.Errorf("%w: linux kernel %s (ELF): %w", ErrInvalidConfig, l.Kernel, err)
		}
	} else if _, err := boot.ParseBzImage(k); err != nil {
		return nil, fmt.Errorf("%w: linux kernel %s: %w", ErrInvalidConfig, l.Kernel, err)
	}
	if l.Initrd != "" {
		if img.initrd, err = os.ReadFile(l.Initrd); err != nil {
			return nil, fmt.Errorf("%w: reading linux initrd: %w", ErrInvalidConfig, err)
		}
	}
	return img, nil
}

// isGuestFile reports whether name is a path rather than a built-in name.
func isGuestFile(name string) bool {
	return strings.Contains(name, "/") || strings.HasSuffix(name, ".elf")
}

// resolveGuest reads and parses the guest the config names.
func resolveGuest(name string) (*guestImage, error) {
	if name == "" {
		return nil, fmt.Errorf("%w: guest: none given (a built-in name: %s; or an ELF file)", ErrInvalidConfig, strings.Join(guests.Names(), ", "))
	}
	var b []byte
	builtin := !isGuestFile(name)
	if builtin {
		var err error
		if b, err = guests.ELF(name); err != nil {
			return nil, fmt.Errorf("%w: guest: %w", ErrInvalidConfig, err)
		}
	} else {
		var err error
		if b, err = os.ReadFile(name); err != nil {
			return nil, fmt.Errorf("%w: reading guest file: %w", ErrInvalidConfig, err)
		}
	}
	img, err := boot.ParseELF(b)
	if err != nil {
		return nil, fmt.Errorf("%w: parsing guest %s: %w", ErrInvalidConfig, name, err)
	}
	return &guestImage{builtin: builtin, elf: img}, nil
}

// regionSpecs returns the RAM layout the config asks for.
func (c *Config) regionSpecs() []memory.RegionSpec {
	if len(c.Regions) > 0 {
		return c.Regions
	}
	return []memory.RegionSpec{{Name: "ram", Base: 0, Size: c.MemoryBytes}}
}

// validate checks everything that needs no kernel object and returns the
// parsed guest with every problem found.
func (c *Config) validate() (*guestImage, []error) {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...))
	}
	switch {
	case len(c.Regions) > 0 && c.MemoryBytes != 0:
		bad("memory: give MemoryBytes or Regions, not both")
	case len(c.Regions) == 0 && c.MemoryBytes == 0:
		bad("memory: zero bytes")
	case len(c.Regions) == 0 && c.MemoryBytes%memory.PageSize != 0:
		bad("memory: %d bytes is not a multiple of %d", c.MemoryBytes, memory.PageSize)
	}
	specs := c.regionSpecs()
	for i, a := range specs {
		if a.Size == 0 {
			if len(c.Regions) > 0 {
				bad("memory: %v has zero size", a)
			}
			continue
		}
		for _, b := range specs[i+1:] {
			if b.Size != 0 && a.Base < b.Base+memory.GPA(b.Size) && b.Base < a.Base+memory.GPA(a.Size) {
				bad("memory: %v overlaps %v", a, b)
			}
		}
		for _, w := range mmioWindows {
			if uint64(a.Base) < w.base+w.size && w.base < uint64(a.Base)+a.Size {
				bad("memory: %v overlaps the %s's MMIO window [%#x, %#x)", a, w.name, w.base, w.base+w.size)
			}
		}
	}
	if len(c.Regions) > 0 {
		inRAM := false
		for _, r := range specs {
			inRAM = inRAM || r.Base == 0 && memory.GPA(r.Size) >= BootAreaEnd
		}
		if !inRAM {
			bad("memory: no region holds tern's boot area [0, %#x)", uint64(BootAreaEnd))
		}
	} else if c.MemoryBytes != 0 && memory.GPA(c.MemoryBytes) < BootAreaEnd {
		bad("memory: %d bytes does not hold tern's boot area [0, %#x)", c.MemoryBytes, uint64(BootAreaEnd))
	}
	if c.VCPUs < 0 {
		bad("vcpus: %d is negative", c.VCPUs)
	}
	switch {
	case c.Disk != nil && len(c.Disks) > 0:
		bad("disks: give Disk or Disks, not both")
	case len(c.Disks) > MaxDisks:
		bad("disks: %d given, at most %d", len(c.Disks), MaxDisks)
	}
	for i, d := range c.Disks {
		if d == nil {
			bad("disks[%d]: no backend", i)
		}
	}
	errs = append(errs, c.validateNICs()...)
	if c.Linux != nil {
		if c.Guest != "" {
			bad("guest: give Guest or Linux, not both")
		}
		if c.VCPUs > acpi.MaxVCPUs {
			bad("vcpus: %d; a Linux guest's MADT lists at most %d (xAPIC IDs are 8 bits)", c.VCPUs, acpi.MaxVCPUs)
		}
		img, err := resolveLinux(c.Linux)
		if err != nil {
			errs = append(errs, err)
		}
		return img, errs
	}
	img, err := resolveGuest(c.Guest)
	if err != nil {
		errs = append(errs, err)
		return nil, errs
	}
	for _, s := range img.elf.Segments {
		end := s.Addr + memory.GPA(s.MemSize)
		if s.Addr < BootAreaEnd {
			bad("guest %s: segment [%#x, %#x) overlaps tern's boot area below %#x", c.Guest, uint64(s.Addr), uint64(end), uint64(BootAreaEnd))
		}
		inRAM := false
		for _, r := range specs {
			if s.Addr >= r.Base && end >= s.Addr && end <= r.Base+memory.GPA(r.Size) {
				inRAM = true
			}
		}
		if !inRAM && c.MemoryBytes != 0 || !inRAM && len(c.Regions) > 0 {
			bad("guest %s: segment [%#x, %#x) does not fit in guest RAM", c.Guest, uint64(s.Addr), uint64(end))
		}
	}
	return img, errs
}
