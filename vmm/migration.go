package vmm

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"

	"tern/vmm/kvm"
	"tern/vmm/memory"
	"tern/vmm/vcpu"
)

// What a live migration (package migration) needs of a VM beyond running
// it: a VM built on memory it is given, its memory slots with dirty
// logging, and its vCPUs' KVM handles for state capture.

// NewMigrationTarget builds a VM as New does from cfg, but on mem, which
// it takes ownership of (closing it if it fails), and loads nothing into
// it: no guest, no boot state, no parameter block. A migration fills the
// memory (or mem already holds the sender's, same-host) and restores the
// vCPUs. mem's regions must be cfg's.
func NewMigrationTarget(cfg Config, mem *memory.Memory) (_ *VM, err error) {
	var specs []memory.RegionSpec
	for _, r := range mem.Regions() {
		specs = append(specs, r.Spec())
	}
	want := slices.Clone(cfg.regionSpecs())
	slices.SortFunc(want, func(a, b memory.RegionSpec) int { return cmp.Compare(a.Base, b.Base) })
	_, errs := cfg.validate()
	if !slices.Equal(specs, want) {
		errs = append(errs, fmt.Errorf("%w: memory: the target's regions %v are not the config's %v", ErrInvalidConfig, specs, want))
	}
	sys, kerr := kvm.Open()
	if kerr != nil {
		errs = append(errs, kerr)
	} else if err := checkVCPUs(sys, cfg.VCPUs); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		if sys != nil {
			sys.Close()
		}
		mem.Close()
		return nil, errors.Join(errs...)
	}
	vm := &VM{log: cfg.Logger, sys: sys, stopReq: make(chan struct{}), mem: mem}
	if vm.log == nil {
		vm.log = slog.New(slog.DiscardHandler)
	}
	vm.devCtx, vm.devCancel = context.WithCancel(context.Background())
	defer func() {
		if err != nil {
			vm.Close()
		}
	}()
	if vm.kvm, err = sys.CreateVM(); err != nil {
		return nil, err
	}
	for i, s := range vm.MemorySlots() {
		if err := vm.kvm.SetUserMemoryRegion(s); err != nil {
			return nil, fmt.Errorf("setting memory slot of region %d: %w", i, err)
		}
	}
	if cfg.Linux != nil {
		// Before the devices (their irqfds need the irqchip) and the
		// vCPUs (each gets its local APIC); the migration loads their
		// state (SetPlatformState).
		if err := vm.createLinuxPlatform(); err != nil {
			return nil, err
		}
	}
	supported, err := sys.SupportedCPUID()
	if err != nil {
		return nil, err
	}
	if err := vm.attachDevices(cfg); err != nil {
		return nil, err
	}
	if err := vm.attachNICs(cfg); err != nil {
		return nil, err
	}
	if cfg.Linux != nil {
		vm.startInterruptWatchdog()
	}
	for id := range max(cfg.VCPUs, 1) {
		// As in New: each vCPU is created on its own locked thread and
		// parks before its first instruction; the migration restores its
		// state and Run (or Resume) lets it go.
		create := func() (*kvm.VCPU, error) {
			cpu, err := vm.kvm.CreateVCPU(id)
			if err != nil {
				return nil, err
			}
			if err := cpu.SetCPUID2(cpuidFor(supported, id)); err != nil {
				return nil, err
			}
			return cpu, nil
		}
		v, err := vcpu.Start(vcpu.Config{
			Create: create, Ports: vm.ports, MMIO: vm.mmio,
			WaitOnHLT: id > 0, StartPaused: true,
		})
		if err != nil {
			return nil, err
		}
		vm.mu.Lock()
		vm.vcpus = append(vm.vcpus, v)
		vm.mu.Unlock()
	}
	return vm, nil
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
