package vmm

import (
	"errors"
	"fmt"
	"time"

	"tern/vmm/devices"
	"tern/vmm/vcpu"
)

// attachDevices creates the devices and registers them on the buses.
func (vm *VM) attachDevices(cfg Config) error {
	hist := cfg.SerialHistoryBytes
	if hist <= 0 {
		hist = defaultSerialHistory
	}
	var uartIRQLine devices.Interrupt = devices.NoInterrupt{}
	if cfg.Linux != nil {
		// An irqfd, as the virtio devices' (virtio_irq.go): a transmitting
		// vCPU signals an eventfd, where a KVM_IRQ_LINE pair would make it
		// two ioctls, and KVM pulses COM1's ISA line from its own worker.
		fd, err := newIRQFD(vm.kvm, uartIRQ)
		if err != nil {
			return fmt.Errorf("wiring the UART's interrupt: %w", err)
		}
		vm.irqfds = append(vm.irqfds, fd)
		uartIRQLine = fd
	}
	vm.uart = devices.NewUART(devices.NewHistory(hist), uartIRQLine)
	vm.debugExit = devices.NewDebugExit()
	vm.bootTimer = devices.NewBootTimer(time.Now(), nil)
	vm.ports, vm.mmio = &vcpu.PortBus{}, &vcpu.MMIOBus{}
	errs := []error{
		vm.ports.Register("UART", devices.UARTBase, 8, vm.uart),
		vm.ports.Register("debug exit", devices.DebugExitPort, 1, exitPort{vm}),
		vm.mmio.Register("boot timer", devices.BootTimerAddr, BootTimerSize, vm.bootTimer),
	}
	if cfg.Linux != nil {
		vm.power = devices.NewPower()
		errs = append(errs, vm.ports.Register("ACPI power", devices.SleepControlPort, devices.PowerPorts, powerPort{vm}),
			vm.ports.Register("keyboard controller reset", devices.KeyboardCommandPort, 1, powerPort{vm}))
	}
	for i, d := range cfg.disks() {
		name := diskName(i)
		blk := devices.NewVirtioBlk(d, name, vm.mem)
		// tern's own guests poll: no interrupt, and each notification is
		// served on the notifying vCPU (see virtio_irq.go).
		t := devices.NewVirtioMMIO(vm.devCtx, blk, vm.mem, devices.NoInterrupt{})
		if cfg.Linux != nil {
			var err error
			if t, err = vm.newLinuxVirtioMMIO(i, blk); err != nil {
				return errors.Join(append(errs, err)...)
			}
		}
		vm.virtioBlks = append(vm.virtioBlks, t)
		errs = append(errs, vm.mmio.Register("virtio-blk "+name, VirtioBlkAddr(i), devices.MMIOSize, t))
	}
	return errors.Join(errs...)
}

// diskName is disk i's device name, as Linux would call it: vda, vdb, ….
func diskName(i int) string { return "vd" + string(rune('a'+i)) }

// exitPort is the debug-exit port: it records the status and stops every
// vCPU, the writer included, before the writer runs another instruction.
type exitPort struct{ vm *VM }

func (p exitPort) ReadPort(port uint16, data []byte) { p.vm.debugExit.ReadPort(port, data) }

func (p exitPort) WritePort(port uint16, data []byte) {
	p.vm.debugExit.WritePort(port, data)
	p.vm.stopVCPUs()
}

// powerPort is a Linux guest's ACPI power registers: a power-off or reset
// stops every vCPU, the writer included, as the debug-exit port does.
type powerPort struct{ vm *VM }

func (p powerPort) ReadPort(port uint16, data []byte) { p.vm.power.ReadPort(port, data) }

func (p powerPort) WritePort(port uint16, data []byte) {
	if p.vm.power.Write(port, data) {
		p.vm.stopVCPUs()
	}
}
