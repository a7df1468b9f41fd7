package kvm

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// Dirty logging by bitmap. A slot set with MemLogDirtyPages has its guest
// writes logged; GetDirtyLog fetches the log as one bit per page (bit i of
// word i/64 is page i of the slot, the layout of vmm/memory's
// DirtyBitmap).
//
// Without manual protect, GetDirtyLog also clears KVM's log and
// write-protects the reported pages again, in one step. With manual
// protect (EnableManualDirtyLogProtect) GetDirtyLog only reads the log,
// and ClearDirtyLog clears and re-protects the pages the caller has
// copied: the copy happens between the two, so a write racing with it is
// never lost and the re-protection cost is paid only for pages actually
// harvested.

// DirtyBitmapWords is the number of uint64 words of a dirty bitmap for a
// slot of slotBytes bytes.
func DirtyBitmapWords(slotBytes uint64) int {
	pages := slotBytes / uint64(unix.Getpagesize())
	return int((pages + 63) / 64)
}

// slotPages is the pages of r's slot.
func slotPages(r MemoryRegion) uint64 { return uint64(len(r.Memory) / unix.Getpagesize()) }

// GetDirtyLog copies the dirty log of r's slot into bitmap
// (KVM_GET_DIRTY_LOG). r is the region given to SetUserMemoryRegion, with
// MemLogDirtyPages in its flags; bitmap must hold at least
// DirtyBitmapWords(len(r.Memory)) words, since KVM writes that many.
func (vm *VM) GetDirtyLog(r MemoryRegion, bitmap []uint64) error {
	if r.Flags&MemLogDirtyPages == 0 {
		return fmt.Errorf("getting dirty log of slot %d: the slot does not log dirty pages", r.Slot)
	}
	if want := DirtyBitmapWords(uint64(len(r.Memory))); want == 0 || len(bitmap) < want {
		return fmt.Errorf("getting dirty log of slot %d: bitmap of %d words, want %d", r.Slot, len(bitmap), want)
	}
	fd, err := vm.rawFd()
	if err != nil {
		return err
	}
	arg := newDirtyLogArg(r.Slot, bitmap)
	if err := ioctlPtr(fd, kvmGetDirtyLog, &arg); err != nil {
		return fmt.Errorf("getting dirty log of slot %d: %w", r.Slot, err)
	}
	return nil
}

// EnableManualDirtyLogProtect switches the VM to manual dirty-log protect
// (KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2 with
// KVM_DIRTY_LOG_MANUAL_PROTECT_ENABLE): GetDirtyLog stops clearing the log
// and ClearDirtyLog does it. Enable it before the first GetDirtyLog.
func (vm *VM) EnableManualDirtyLogProtect() error {
	const op = "enabling manual dirty-log protect"
	flags, err := vm.requireVM(op, CapManualDirtyLogProtect2)
	if err != nil {
		return err
	}
	if flags&dirtyLogManualProtectEnable == 0 {
		return &CapabilityError{Op: op, Cap: CapManualDirtyLogProtect2}
	}
	return vm.EnableCap(CapManualDirtyLogProtect2, dirtyLogManualProtectEnable)
}

// ClearDirtyLog clears, in the dirty log of r's slot, the pages
// firstPage+i for each bit i set in bitmap, and write-protects them again
// so the next write is logged (KVM_CLEAR_DIRTY_LOG, manual protect only).
// firstPage must be a multiple of 64; bitmap covers len(bitmap)*64 pages,
// cut at the end of the slot.
func (vm *VM) ClearDirtyLog(r MemoryRegion, firstPage uint64, bitmap []uint64) error {
	pages := slotPages(r)
	if firstPage%64 != 0 || firstPage >= pages || len(bitmap) == 0 {
		return fmt.Errorf("clearing dirty log of slot %d: pages from %d with %d bitmap words outside the slot's %d pages or misaligned",
			r.Slot, firstPage, len(bitmap), pages)
	}
	n := min(uint64(len(bitmap))*64, pages-firstPage)
	fd, err := vm.rawFd()
	if err != nil {
		return err
	}
	arg := newClearDirtyLogArg(r.Slot, firstPage, uint32(n), bitmap)
	if err := ioctlPtr(fd, kvmClearDirtyLog, &arg); err != nil {
		return fmt.Errorf("clearing dirty log of slot %d: %w", r.Slot, err)
	}
	return nil
}
