package vmm

import (
	"cmp"
	"fmt"
	"slices"

	"tern/vmm/kvm"
	"tern/vmm/memory"
)

// What a live migration (package migration) needs of a VM beyond running
// it: a VM built on memory it is given (by newVM, the builder New uses,
// without the boot image), its memory slots with dirty logging, and its
// vCPUs' KVM handles. Its state is saved and restored in vm_state.go.

// NewMigrationTarget builds a VM as New does from cfg, but on mem, which
// it takes ownership of (closing it if it fails), and loads nothing into
// it: no guest, no boot state, no parameter block. A migration fills the
// memory (or mem already holds the sender's, same-host) and restores the
// VM's state (RestoreState). mem's regions must be cfg's.
func NewMigrationTarget(cfg Config, mem *memory.Memory) (*VM, error) {
	return newVM(cfg, buildOptions{mem: mem})
}

// checkRegions reports whether mem's regions are the ones cfg makes.
func checkRegions(cfg Config, mem *memory.Memory) error {
	var specs []memory.RegionSpec
	for _, r := range mem.Regions() {
		specs = append(specs, r.Spec())
	}
	want := slices.Clone(cfg.regionSpecs())
	slices.SortFunc(want, func(a, b memory.RegionSpec) int { return cmp.Compare(a.Base, b.Base) })
	if !slices.Equal(specs, want) {
		return fmt.Errorf("%w: memory: the target's regions %v are not the config's %v", ErrInvalidConfig, specs, want)
	}
	return nil
}

// MemorySlots returns the KVM memory slot of each region, slot i for
// Memory().Regions()[i], with no flags: the caller adds
// kvm.MemLogDirtyPages to log dirty pages and sets the slot again.
func (vm *VM) MemorySlots() []kvm.MemoryRegion {
	var out []kvm.MemoryRegion
	for i, r := range vm.mem.Regions() {
		out = append(out, kvm.MemoryRegion{Slot: uint32(i), GuestPhysAddr: uint64(r.Base()), Memory: r.Bytes()})
	}
	return out
}

// SetDirtyLogging turns KVM's dirty logging of every memory slot on or
// off (KVM_MEM_LOG_DIRTY_PAGES) and returns the slots as set.
func (vm *VM) SetDirtyLogging(on bool) ([]kvm.MemoryRegion, error) {
	slots := vm.MemorySlots()
	for i := range slots {
		if on {
			slots[i].Flags |= kvm.MemLogDirtyPages
		}
		if err := vm.kvm.SetUserMemoryRegion(slots[i]); err != nil {
			return nil, fmt.Errorf("setting dirty logging of slot %d: %w", i, err)
		}
	}
	return slots, nil
}

// KVMVCPUs returns every vCPU's KVM handle in id order, before or after
// Run. Use one only while no thread is in KVM_RUN on it: before Run, while
// the VM is paused, or after Run returned.
func (vm *VM) KVMVCPUs() []*kvm.VCPU {
	var out []*kvm.VCPU
	for _, v := range vm.VCPUs() {
		out = append(out, v.KVM())
	}
	return out
}
