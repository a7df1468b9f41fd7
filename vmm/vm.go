package vmm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"tern/vmm/boot"
	"tern/vmm/devices"
	"tern/vmm/guests"
	"tern/vmm/kvm"
	"tern/vmm/memory"
	"tern/vmm/vcpu"
)

// ErrStopped ends Run after Stop.
var ErrStopped = errors.New("VM stopped")

// ErrPoweredOff ends Run when a Linux guest powered off through its ACPI
// sleep-control register (the kernel's poweroff, ACPI S5).
var ErrPoweredOff = errors.New("guest powered off (ACPI S5)")

// ErrGuestReset ends Run when a Linux guest reset the machine through its
// ACPI reset register (the kernel's reboot). A VM runs once: whoever ran
// it starts a fresh one to reboot (instance does; tern vmm run ends).
var ErrGuestReset = errors.New("guest reset the machine (ACPI reset register)")

// ErrAlreadyRan reports a second Run of a VM.
var ErrAlreadyRan = errors.New("VM already ran")

// ErrClosed reports a Run, Pause or Resume after Close.
var ErrClosed = errors.New("VM closed")

// defaultSerialHistory is the serial output kept when the config says 0.
const defaultSerialHistory = 1 << 20

// hlt is the instruction the application processors park on.
const hlt = 0xf4

// VM is one virtual machine and everything it owns (see doc.go).
type VM struct {
	// Immutable after New.
	log       *slog.Logger
	sys       *kvm.System
	kvm       *kvm.VM
	mem       *memory.Memory
	ports     *vcpu.PortBus
	mmio      *vcpu.MMIOBus
	uart      *devices.UART
	debugExit *devices.DebugExit
	// linux is set for a Linux guest's VM (Config.Linux), with its
	// irqchip and PIT; set once while building.
	linux bool
	// irqchip is set for a VM with KVM's in-kernel irqchip (PIC pair,
	// IOAPIC, a local APIC per vCPU): a Linux guest's, or a guest whose
	// ELF note asks for its local APICs (boot.ELFImage.LocalAPICs); its
	// application processors start in KVM's reset state and wait for
	// INIT and SIPI. Set once while building.
	irqchip bool
	// power is a Linux guest's ACPI power registers; nil for tern's own.
	power     *devices.Power
	bootTimer *devices.BootTimer
	// virtioBlks are the disks' transports, in slot order; closed by
	// Close.
	virtioBlks []*devices.VirtioMMIO
	// nics are the network cards, in slot order; each owns its TAP, its
	// receive goroutine and its transport; closed by Close.
	nics []*devices.VirtioNet
	// irqfds are a Linux guest's virtio interrupts; closed by Close.
	irqfds []*irqfd
	// stopWatchdog stops a Linux guest's interrupt watchdog and waits for
	// it (interrupt_watchdog.go); nil without one. Called by Close.
	stopWatchdog func()
	// devCtx bounds the devices' backend IO; cancelled by Close.
	devCtx    context.Context
	devCancel context.CancelFunc
	// stopReq is closed by the first Stop.
	stopReq  chan struct{}
	stopOnce sync.Once

	mu sync.Mutex
	// vcpus are the vCPU goroutines, started parked by New; ran is set
	// by Run, closed by Close.
	vcpus  []*vcpu.VCPU
	ran    bool
	closed bool
	// startPaused is set by a Pause before Run: Run leaves the vCPUs
	// parked.
	startPaused bool
	// paused is set by Pause and cleared by Resume (before Run too, with
	// startPaused).
	paused bool

	// histMu guards history: what was done to the VM, for a crash report
	// (crash_report.go); historyDropped counts the events between its
	// first and last ones that it no longer holds.
	histMu         sync.Mutex
	history        []HistoryEvent
	historyDropped int
}

// New validates cfg, reporting every problem at once, then builds the VM:
// RAM, the guest loaded, the devices, and one goroutine per vCPU, which
// creates its vCPU on its own thread and parks before the first guest
// instruction until Run.
func New(cfg Config) (*VM, error) { return newVM(cfg, buildOptions{loadImage: true}) }

// buildOptions is what differs between booting a VM (New) and building a
// migration target (NewMigrationTarget); newVM is the one builder.
type buildOptions struct {
	// mem, when set, is the guest memory to build on, which the VM takes
	// over (closing it on failure too); its regions must be the
	// config's. When nil the VM makes its memory from the config.
	mem *memory.Memory
	// loadImage loads the boot image: the guest, the boot vCPU's state,
	// the application processors' HLT and the parameter block. Without it
	// the memory is left as given and every vCPU in KVM's reset state,
	// for a migration to fill and restore (RestoreState).
	loadImage bool
}

// newVM validates cfg (and a given memory against it), reporting every
// problem at once, then builds the VM as opts say.
func newVM(cfg Config, opts buildOptions) (_ *VM, err error) {
	img, errs := cfg.validate()
	if opts.mem != nil {
		if err := checkRegions(cfg, opts.mem); err != nil {
			errs = append(errs, err)
		}
	}
	sys, kerr := kvm.Open()
	switch {
	case kerr != nil && len(errs) == 0:
		errs = append(errs, kerr)
	case kerr != nil: // the config's own problems first; KVM's limits unknown
	default:
		if err := checkVCPUs(sys, cfg.VCPUs); err != nil {
			errs = append(errs, err)
		}
		// Pause and Stop rely on it to kick a vCPU without a race.
		if err := sys.RequireExtension(kvm.CapImmediateExit); err != nil {
			errs = append(errs, fmt.Errorf("checking KVM_CAP_IMMEDIATE_EXIT: %w", err))
		}
	}
	if len(errs) > 0 {
		if sys != nil {
			sys.Close()
		}
		if opts.mem != nil {
			opts.mem.Close()
		}
		return nil, errors.Join(errs...)
	}
	vm := &VM{log: cfg.Logger, sys: sys, stopReq: make(chan struct{}), mem: opts.mem}
	if vm.log == nil {
		vm.log = slog.New(slog.DiscardHandler)
	}
	vm.devCtx, vm.devCancel = context.WithCancel(context.Background())
	defer func() {
		if err != nil {
			vm.Close()
		}
	}()
	// A migration target builds without the image but with the
	// platform the image asks for.
	vm.irqchip = cfg.Linux != nil || img != nil && img.elf != nil && img.elf.LocalAPICs
	if !opts.loadImage {
		img = nil
	}
	if err := vm.build(cfg, img); err != nil {
		return nil, err
	}
	if opts.loadImage {
		vm.note(fmt.Sprintf("booted (%d vCPUs)", max(cfg.VCPUs, 1)))
	} else {
		vm.note(fmt.Sprintf("built as a migration target (%d vCPUs)", max(cfg.VCPUs, 1)))
	}
	return vm, nil
}

// checkVCPUs checks n against the host's KVM_CAP_MAX_VCPUS (or, where
// that is absent, KVM_CAP_NR_VCPUS).
func checkVCPUs(sys *kvm.System, n int) error {
	limit, err := sys.CheckExtension(kvm.CapMaxVCPUs)
	if err != nil {
		return err
	}
	capName := "KVM_CAP_MAX_VCPUS"
	if limit == 0 {
		if limit, err = sys.CheckExtension(kvm.CapNrVCPUs); err != nil {
			return err
		}
		capName = "KVM_CAP_NR_VCPUS"
	}
	if limit == 0 {
		limit, capName = 4, "the KVM API's default"
	}
	if n > limit {
		return fmt.Errorf("%w: vcpus: %d is more than this host's KVM allows (%d, %s)", ErrInvalidConfig, n, limit, capName)
	}
	return nil
}

// build creates everything of a validated config: the memory unless the
// VM has it, the KVM VM, a Linux guest's platform, the boot image when img
// is set, the devices and the vCPUs.
func (vm *VM) build(cfg Config, img *guestImage) error {
	if vm.mem == nil {
		mem, err := memory.New(cfg.regionSpecs()...)
		if err != nil {
			return fmt.Errorf("creating guest memory: %w", err)
		}
		vm.mem = mem
	}
	var err error
	if vm.kvm, err = vm.sys.CreateVM(); err != nil {
		return err
	}
	for i, s := range vm.MemorySlots() {
		if err := vm.kvm.SetUserMemoryRegion(s); err != nil {
			return fmt.Errorf("setting memory slot of region %d: %w", i, err)
		}
	}
	linux := cfg.Linux != nil
	switch {
	case linux:
		// Before the devices (their irqfds need the irqchip) and the
		// vCPUs (each gets its local APIC).
		if err := vm.createLinuxPlatform(); err != nil {
			return err
		}
	case vm.irqchip:
		// Before the vCPUs, each of which gets its local APIC.
		if err := vm.kvm.CreateIRQChip(); err != nil {
			return fmt.Errorf("creating the guest's local APICs: %w", err)
		}
	}
	var bootCPU *boot.CPUState
	if img != nil {
		st, err := loadImage(vm.mem, cfg, img)
		if err != nil {
			return err
		}
		if max(cfg.VCPUs, 1) > 1 && !vm.irqchip {
			if err := vm.mem.Write(APParkAddr, []byte{hlt}); err != nil {
				return fmt.Errorf("placing the application processors' HLT: %w", err)
			}
		}
		bootCPU = &st
	}
	if err := vm.attachDevices(cfg); err != nil {
		return err
	}
	if err := vm.attachNICs(cfg); err != nil {
		return err
	}
	if linux {
		vm.startInterruptWatchdog()
	}
	tscKHz, tscErr, err := vm.startVCPUs(max(cfg.VCPUs, 1), bootCPU)
	if err != nil {
		return err
	}
	if img != nil && (img.builtin || cfg.Params != nil) {
		if tscErr != nil {
			vm.log.Warn("guest TSC frequency unknown; the guest assumes its default", "err", tscErr)
		}
		if err := vm.writeParams(cfg, tscKHz); err != nil {
			return err
		}
	}
	return nil
}

// startVCPUs starts n vCPU goroutines, each parked before its first
// instruction until Run, and returns the boot vCPU's TSC frequency (or
// why it is unknown). With bootCPU set the boot vCPU starts in that state
// and, for tern's own guests without the irqchip, the application
// processors in long mode at their HLT; with the irqchip (a Linux guest,
// the smp guest) the application processors, and without bootCPU every
// vCPU (a migration restores them), stay in KVM's reset state.
func (vm *VM) startVCPUs(n int, bootCPU *boot.CPUState) (tscKHz uint32, tscErr, err error) {
	supported, err := vm.sys.SupportedCPUID()
	if err != nil {
		return 0, nil, err
	}
	tscDeadline := false
	if vm.irqchip {
		v, err := vm.kvm.CheckExtension(kvm.CapTSCDeadlineTimer)
		if err != nil {
			return 0, nil, err
		}
		tscDeadline = v > 0
	}
	for id := range n {
		// tern's own guests start every vCPU in long mode, the
		// application processors parked on a HLT; with the irqchip they
		// stay in KVM's reset state until the guest sends them INIT and
		// a start-up IPI (linux_platform.go).
		var st *boot.CPUState
		if bootCPU != nil && (id == 0 || !vm.irqchip) {
			s := *bootCPU
			if id > 0 {
				s.RIP = uint64(APParkAddr)
			}
			st = &s
		}
		// Runs on the vCPU's own thread (see vmm/vcpu), before Start
		// returns.
		create := func() (*kvm.VCPU, error) {
			cpu, err := vm.kvm.CreateVCPU(id)
			if err != nil {
				return nil, err
			}
			cpuid := cpuidFor(supported, id)
			switch {
			case vm.linux:
				cpuid = linuxCPUID(cpuid, tscDeadline)
			case vm.irqchip && tscDeadline:
				// The local APICs' TSC-deadline mode, which KVM
				// offers a guest only where its CPUID says so.
				cpuid = withTSCDeadline(cpuid)
			}
			if err := cpu.SetCPUID2(cpuid); err != nil {
				return nil, err
			}
			if st != nil {
				if err := setCPUState(cpu, *st); err != nil {
					return nil, err
				}
			}
			if id == 0 {
				tscKHz, tscErr = cpu.TSCkHz()
			}
			return cpu, nil
		}
		v, err := vcpu.Start(vcpu.Config{
			Create: create, Ports: vm.ports, MMIO: vm.mmio,
			WaitOnHLT: id > 0, StartPaused: true, // until Run
		})
		if err != nil {
			return 0, nil, err
		}
		vm.mu.Lock()
		vm.vcpus = append(vm.vcpus, v)
		vm.mu.Unlock()
	}
	return tscKHz, tscErr, nil
}

// loadImage loads the guest into mem and returns the boot vCPU's state.
func loadImage(mem *memory.Memory, cfg Config, img *guestImage) (boot.CPUState, error) {
	if img.elf == nil {
		var li *boot.LinuxImage
		var err error
		if img.vmlinux != nil {
			li, err = boot.LoadVmlinux(mem, img.vmlinux, img.initrd, cfg.Linux.Cmdline)
		} else {
			li, err = boot.LoadLinux(mem, img.kernel, img.initrd, cfg.Linux.Cmdline)
		}
		if err != nil {
			return boot.CPUState{}, fmt.Errorf("loading linux kernel %s: %w", cfg.Linux.Kernel, err)
		}
		if err := writeACPI(mem, cfg); err != nil {
			return boot.CPUState{}, err
		}
		st, err := boot.LinuxState(mem, li)
		if err != nil {
			return boot.CPUState{}, fmt.Errorf("preparing long mode for linux: %w", err)
		}
		return st, nil
	}
	if err := boot.LoadELF(mem, img.elf); err != nil {
		return boot.CPUState{}, fmt.Errorf("loading guest %s: %w", cfg.Guest, err)
	}
	st, err := boot.LongModeState(mem, img.elf.Entry)
	if err != nil {
		return boot.CPUState{}, fmt.Errorf("preparing long mode: %w", err)
	}
	return st, nil
}

// writeParams writes the guests' parameter block.
func (vm *VM) writeParams(cfg Config, tscKHz uint32) error {
	var p guests.Params
	if cfg.Params != nil {
		p = *cfg.Params
	}
	if p.TSCkHz == 0 {
		p.TSCkHz = uint64(tscKHz)
	}
	if p.VCPUs == 0 {
		p.VCPUs = uint64(max(cfg.VCPUs, 1))
	}
	if len(cfg.disks()) > 0 && p.VirtioBase == 0 {
		p.VirtioBase = VirtioBlkBase
	}
	if err := vm.mem.Write(guests.ParamsAddr, p.Encode()); err != nil {
		return fmt.Errorf("writing guest parameters: %w", err)
	}
	return nil
}

// Serial returns the UART: its Output history holds what the guest
// printed; Input queues bytes for the guest to read.
func (vm *VM) Serial() *devices.UART { return vm.uart }

// Memory returns guest RAM. It is valid until Close.
func (vm *VM) Memory() *memory.Memory { return vm.mem }

// BootTimer returns the boot timer, done when the guest wrote its magic.
func (vm *VM) BootTimer() *devices.BootTimer { return vm.bootTimer }

// VirtioBlks returns the disks' virtio-mmio transports in slot order (for
// migration).
func (vm *VM) VirtioBlks() []*devices.VirtioMMIO { return vm.virtioBlks }

// KVM returns the KVM VM (for dirty logging and state capture); valid
// until Close.
func (vm *VM) KVM() *kvm.VM { return vm.kvm }

// VCPUs returns the vCPUs, which New started parked; see Pause for when
// their KVM handles may be used.
func (vm *VM) VCPUs() []*vcpu.VCPU {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	return append([]*vcpu.VCPU(nil), vm.vcpus...)
}

// Close stops the vCPUs and waits for their goroutines, stops the network
// cards' receive goroutines (closing their TAPs) and the virtio queue
// workers, closes the eventfds, every vCPU, the VM and /dev/kvm, and
// unmaps guest RAM. Closing twice is a no-op.
func (vm *VM) Close() error {
	vm.Stop()
	vm.mu.Lock()
	if vm.closed {
		vm.mu.Unlock()
		return nil
	}
	vm.closed = true
	running := vm.vcpus
	vm.mu.Unlock()
	for _, v := range running {
		v.Wait() // its error was Run's to report
	}
	if vm.stopWatchdog != nil {
		vm.stopWatchdog()
	}
	// The cards' receive goroutines write guest memory: they end first,
	// with their transports' workers and ioeventfds.
	errs := []error{vm.closeNICs()}
	vm.devCancel()
	// The transports' workers and ioeventfds, then the irqfds, go before
	// the KVM VM they are registered in.
	for _, t := range vm.virtioBlks {
		errs = append(errs, t.Close())
	}
	for _, i := range vm.irqfds {
		errs = append(errs, i.Close())
	}
	if vm.kvm != nil {
		errs = append(errs, vm.kvm.Close())
	}
	if vm.mem != nil {
		errs = append(errs, vm.mem.Close())
	}
	errs = append(errs, vm.sys.Close())
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("closing VM: %w", err)
	}
	return nil
}
