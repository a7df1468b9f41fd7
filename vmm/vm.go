package vmm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"tern/tools/guests"
	"tern/vmm/boot"
	"tern/vmm/devices"
	"tern/vmm/kvm"
	"tern/vmm/memory"
	"tern/vmm/vcpu"
)

// ErrStopped ends Run after Stop.
var ErrStopped = errors.New("VM stopped")

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
	cpus      []*kvm.VCPU
	ports     *vcpu.PortBus
	mmio      *vcpu.MMIOBus
	uart      *devices.UART
	debugExit *devices.DebugExit
	bootTimer *devices.BootTimer
	// devCtx bounds the devices' backend IO; cancelled by Close.
	devCtx    context.Context
	devCancel context.CancelFunc
	// stopReq is closed by the first Stop.
	stopReq  chan struct{}
	stopOnce sync.Once

	mu sync.Mutex
	// running are the vCPU goroutines, set by Run; ran is set by Run.
	running []*vcpu.VCPU
	ran     bool
	closed  bool
	// startPaused is set by a Pause before Run: Run starts the vCPUs
	// parked.
	startPaused bool
}

// New validates cfg, reporting every problem at once, then builds the VM:
// RAM, the guest loaded and its vCPUs set to enter it, and the devices. It
// starts nothing; Run does.
func New(cfg Config) (_ *VM, err error) {
	img, errs := cfg.validate()
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
		return nil, errors.Join(errs...)
	}
	vm := &VM{log: cfg.Logger, sys: sys, stopReq: make(chan struct{})}
	if vm.log == nil {
		vm.log = slog.New(slog.DiscardHandler)
	}
	vm.devCtx, vm.devCancel = context.WithCancel(context.Background())
	defer func() {
		if err != nil {
			vm.Close()
		}
	}()
	if err := vm.build(cfg, img); err != nil {
		return nil, err
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

// build creates everything of a validated config.
func (vm *VM) build(cfg Config, img *guestImage) error {
	mem, err := memory.New(cfg.regionSpecs()...)
	if err != nil {
		return fmt.Errorf("creating guest memory: %w", err)
	}
	vm.mem = mem
	if vm.kvm, err = vm.sys.CreateVM(); err != nil {
		return err
	}
	for i, r := range mem.Regions() {
		if err := vm.kvm.SetUserMemoryRegion(kvm.MemoryRegion{Slot: uint32(i), GuestPhysAddr: uint64(r.Base()), Memory: r.Bytes()}); err != nil {
			return err
		}
	}
	if err := boot.LoadELF(mem, img.elf); err != nil {
		return fmt.Errorf("loading guest %s: %w", cfg.Guest, err)
	}
	st, err := boot.LongModeState(mem, img.elf.Entry)
	if err != nil {
		return fmt.Errorf("preparing long mode: %w", err)
	}
	n := max(cfg.VCPUs, 1)
	if n > 1 {
		if err := mem.Write(APParkAddr, []byte{hlt}); err != nil {
			return fmt.Errorf("placing the application processors' HLT: %w", err)
		}
	}
	supported, err := vm.sys.SupportedCPUID()
	if err != nil {
		return err
	}
	for id := range n {
		cpu, err := vm.kvm.CreateVCPU(id)
		if err != nil {
			return err
		}
		vm.cpus = append(vm.cpus, cpu)
		if err := cpu.SetCPUID2(cpuidFor(supported, id)); err != nil {
			return err
		}
		s := st
		if id > 0 {
			s.RIP = uint64(APParkAddr)
		}
		if err := setCPUState(cpu, s); err != nil {
			return err
		}
	}
	if img.builtin || cfg.Params != nil {
		if err := vm.writeParams(cfg); err != nil {
			return err
		}
	}
	return vm.attachDevices(cfg)
}

// writeParams writes the guests' parameter block.
func (vm *VM) writeParams(cfg Config) error {
	var p guests.Params
	if cfg.Params != nil {
		p = *cfg.Params
	}
	if p.TSCkHz == 0 {
		khz, err := vm.cpus[0].TSCkHz()
		if err != nil {
			vm.log.Warn("guest TSC frequency unknown; the guest assumes its default", "err", err)
		}
		p.TSCkHz = uint64(khz)
	}
	if cfg.Disk != nil && p.VirtioBase == 0 {
		p.VirtioBase = VirtioBlkBase
	}
	if err := vm.mem.Write(guests.ParamsAddr, p.Encode()); err != nil {
		return fmt.Errorf("writing guest parameters: %w", err)
	}
	return nil
}

// attachDevices creates the devices and registers them on the buses.
func (vm *VM) attachDevices(cfg Config) error {
	hist := cfg.SerialHistoryBytes
	if hist <= 0 {
		hist = defaultSerialHistory
	}
	vm.uart = devices.NewUART(devices.NewHistory(hist), devices.NoInterrupt{})
	vm.debugExit = devices.NewDebugExit()
	vm.bootTimer = devices.NewBootTimer(time.Now(), nil)
	vm.ports, vm.mmio = &vcpu.PortBus{}, &vcpu.MMIOBus{}
	errs := []error{
		vm.ports.Register("UART", devices.UARTBase, 8, vm.uart),
		vm.ports.Register("debug exit", devices.DebugExitPort, 1, exitPort{vm}),
		vm.mmio.Register("boot timer", devices.BootTimerAddr, BootTimerSize, vm.bootTimer),
	}
	if cfg.Disk != nil {
		blk := devices.NewVirtioBlk(cfg.Disk, "vda", vm.mem)
		errs = append(errs, vm.mmio.Register("virtio-blk", VirtioBlkBase, devices.MMIOSize,
			devices.NewVirtioMMIO(vm.devCtx, blk, vm.mem, devices.NoInterrupt{})))
	}
	return errors.Join(errs...)
}

// exitPort is the debug-exit port: it records the status and stops every
// vCPU, the writer included, before the writer runs another instruction.
type exitPort struct{ vm *VM }

func (p exitPort) ReadPort(port uint16, data []byte) { p.vm.debugExit.ReadPort(port, data) }

func (p exitPort) WritePort(port uint16, data []byte) {
	p.vm.debugExit.WritePort(port, data)
	p.vm.stopVCPUs()
}

// stopVCPUs asks every running vCPU to stop, without waiting.
func (vm *VM) stopVCPUs() {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	for _, v := range vm.running {
		v.Stop()
	}
}

// Run starts the vCPUs and waits until the guest writes its status to
// port 0xf4, Stop is called, ctx ends, or a vCPU fails; see doc.go for
// what it returns. Every vCPU goroutine has ended when it returns. A VM
// runs once.
func (vm *VM) Run(ctx context.Context) (status uint32, err error) {
	vm.mu.Lock()
	switch {
	case vm.closed:
		vm.mu.Unlock()
		return 0, ErrClosed
	case vm.ran:
		vm.mu.Unlock()
		return 0, ErrAlreadyRan
	}
	vm.ran = true
	for i, cpu := range vm.cpus {
		vm.running = append(vm.running, vcpu.Start(vcpu.Config{
			CPU: cpu, Ports: vm.ports, MMIO: vm.mmio, WaitOnHLT: i > 0, StartPaused: vm.startPaused,
		}))
	}
	running := vm.running
	vm.mu.Unlock()
	vm.log.Debug("VM running", "vcpus", len(running))

	ended := make(chan *vcpu.VCPU, len(running))
	var watchers sync.WaitGroup
	for _, v := range running {
		watchers.Go(func() {
			<-v.Done()
			ended <- v
		})
	}
	var cause error
	select {
	case <-vm.debugExit.Done():
	case <-vm.stopReq:
		cause = ErrStopped
	case <-ctx.Done():
		cause = fmt.Errorf("running VM: %w", context.Cause(ctx))
	case v := <-ended:
		cause = v.Wait()
	}
	vm.stopVCPUs()
	var errs []error
	for _, v := range running {
		if err := v.Wait(); err != nil && !errors.Is(cause, err) {
			errs = append(errs, err)
		}
	}
	watchers.Wait()
	if s, ok := vm.debugExit.Status(); ok {
		vm.log.Debug("guest exited", "status", s)
		return s, nil
	}
	if cause == nil { // a vCPU ended without an error: only Stop does that
		cause = ErrStopped
	}
	return 0, errors.Join(append([]error{cause}, errs...)...)
}

// Pause parks every vCPU at an instruction boundary and returns once all
// are parked. Before Run it makes Run start them parked. If one cannot
// pause (it ended), the others are resumed and its error returned.
func (vm *VM) Pause() error {
	running, err := vm.requestBeforeRun(true)
	if running == nil || err != nil {
		return err
	}
	for i, v := range running {
		if err := v.Pause(); err != nil {
			for _, p := range running[:i] {
				p.Resume()
			}
			return fmt.Errorf("pausing VM: %w", err)
		}
	}
	return nil
}

// Resume lets every paused vCPU run on; before Run it undoes a Pause.
func (vm *VM) Resume() error {
	running, err := vm.requestBeforeRun(false)
	if running == nil || err != nil {
		return err
	}
	var errs []error
	for _, v := range running {
		if err := v.Resume(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("resuming VM: %w", err)
	}
	return nil
}

// requestBeforeRun records a Pause (paused) or Resume before Run and
// returns nil vCPUs; once Run started them it returns them instead.
func (vm *VM) requestBeforeRun(paused bool) ([]*vcpu.VCPU, error) {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	if vm.closed {
		return nil, ErrClosed
	}
	if !vm.ran {
		vm.startPaused = paused
		return nil, nil
	}
	return vm.running, nil
}

// Stop makes Run end with ErrStopped (unless the guest already exited);
// it does not wait. Safe from any goroutine, before or during Run.
func (vm *VM) Stop() {
	vm.stopOnce.Do(func() { close(vm.stopReq) })
	vm.stopVCPUs()
}

// Serial returns the UART: its Output history holds what the guest
// printed; Input queues bytes for the guest to read.
func (vm *VM) Serial() *devices.UART { return vm.uart }

// Memory returns guest RAM. It is valid until Close.
func (vm *VM) Memory() *memory.Memory { return vm.mem }

// BootTimer returns the boot timer, done when the guest wrote its magic.
func (vm *VM) BootTimer() *devices.BootTimer { return vm.bootTimer }

// KVM returns the KVM VM (for dirty logging and state capture); valid
// until Close.
func (vm *VM) KVM() *kvm.VM { return vm.kvm }

// VCPUs returns the running vCPUs (nil before Run); see Pause for when
// their KVM handles may be used.
func (vm *VM) VCPUs() []*vcpu.VCPU {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	return append([]*vcpu.VCPU(nil), vm.running...)
}

// Close stops the vCPUs and waits for their goroutines, then closes every
// vCPU, the VM and /dev/kvm, and unmaps guest RAM. Closing twice is a
// no-op.
func (vm *VM) Close() error {
	vm.Stop()
	vm.mu.Lock()
	if vm.closed {
		vm.mu.Unlock()
		return nil
	}
	vm.closed = true
	running := vm.running
	vm.mu.Unlock()
	for _, v := range running {
		v.Wait() // its error was Run's to report
	}
	vm.devCancel()
	var errs []error
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
