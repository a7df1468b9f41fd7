package vmm

import (
	"errors"
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
		vm.virtioBlk = devices.NewVirtioMMIO(vm.devCtx, blk, vm.mem, devices.NoInterrupt{})
		errs = append(errs, vm.mmio.Register("virtio-blk", VirtioBlkBase, devices.MMIOSize, vm.virtioBlk))
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
