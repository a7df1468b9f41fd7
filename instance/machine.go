package instance

import (
	"context"
	"fmt"
	"log/slog"

	"tern/instance/apiv1"
	"tern/internal/blockio"
	"tern/vmm"
	"tern/vmm/devices"
	"tern/vmm/guests"
	"tern/vmm/memory"
)

// Machine is what the controller needs of a VM. It is the seam between
// the controller and package vmm, so a change to the VM's API is an edit
// to vmmMachine alone.
type Machine interface {
	// Run runs the guest until it exits (err nil, its status), Stop, or a
	// failure; see vmm.VM.Run.
	Run(ctx context.Context) (status uint32, err error)
	// Stop makes Run return; it does not wait.
	Stop()
	// Close frees everything the machine owns; Run must have returned.
	Close() error
	// SerialOutput is the console's output history.
	SerialOutput() *devices.History
	// SerialInput queues bytes for the guest's UART and returns how many
	// were taken.
	SerialInput(p []byte) int
}

// MachineConfig is what a Machine is built from.
type MachineConfig struct {
	Spec apiv1.Spec
	// Disks back the virtio-blk devices, one per disk of the spec, in
	// its order. The caller owns them.
	Disks  []blockio.Device
	Logger *slog.Logger
}

// NewMachineFunc builds a Machine; NewVMMachine is the real one.
type NewMachineFunc func(MachineConfig) (Machine, error)

// NewVMMachine builds a KVM VM with package vmm.
func NewVMMachine(cfg MachineConfig) (Machine, error) {
	vcfg := vmm.Config{
		MemoryBytes: cfg.Spec.MemoryMiB << 20,
		VCPUs:       cfg.Spec.VCPUs,
		Disks:       cfg.Disks,
		NICs:        vmmNICs(cfg.Spec),
		Logger:      cfg.Logger,
	}
	var rate uint64
	if g := cfg.Spec.Guest; g.Kind == apiv1.GuestLinux {
		vcfg.Linux = &vmm.LinuxGuest{Kernel: g.Kernel, Initrd: g.Initrd, Cmdline: g.Cmdline}
	} else {
		vcfg.Guest = g.Path
		vcfg.Params, rate = guestParamsFor(cfg.Spec)
	}
	vm, err := vmm.New(vcfg)
	if err != nil {
		return nil, fmt.Errorf("creating VM: %w", err)
	}
	if rate > 0 {
		if err := setDirtyRate(vm.Memory(), rate); err != nil {
			vm.Close()
			return nil, err
		}
	}
	return vmmMachine{vm}, nil
}

// vmmMachine adapts *vmm.VM to Machine.
type vmmMachine struct{ vm *vmm.VM }

func (m vmmMachine) Run(ctx context.Context) (uint32, error) { return m.vm.Run(ctx) }
func (m vmmMachine) Stop()                                   { m.vm.Stop() }
func (m vmmMachine) Close() error                            { return m.vm.Close() }
func (m vmmMachine) SerialOutput() *devices.History          { return m.vm.Serial().Output() }
func (m vmmMachine) SerialInput(p []byte) int                { return m.vm.Serial().Input(p) }

// VM is the VM a migration moves.
func (m vmmMachine) VM() *vmm.VM { return m.vm }

// guestParamsFor turns a built-in guest's API parameters into its
// parameter block, and returns the dirty guest's rate in MiB/s, which
// needs the TSC frequency the VM learns (setDirtyRate).
func guestParamsFor(s apiv1.Spec) (*guests.Params, uint64) {
	g := s.Guest
	if !IsBuiltinGuest(g.Path) {
		return nil, 0
	}
	p := &guests.Params{}
	var rate uint64
	switch g.Path {
	case "dirty":
		// Through the API dirty runs until stopped and verifies every
		// verify_every_sec seconds (default 1, the guest's own); idle 1
		// makes it dirty nothing after the fill.
		p.Passes = guests.PassesForever
		p.Idle = g.Params["idle"] == 1
		if v := g.Params["mem_mib"]; v != 0 {
			p.MemStart, p.MemBytes = dirtyMemStartMiB<<20, v<<20
		}
		p.WorkingSetBytes = g.Params["working_set_mib"] << 20
		p.VerifyEverySec = g.Params["verify_every_sec"]
		rate = g.Params["dirty_mib_per_sec"]
	case "disk":
		// passes (default 1) repeats the write-and-verify, pass K with
		// the pattern of seed + K.
		p.Seed, p.Sectors, p.Passes = g.Params["seed"], g.Params["sectors"], g.Params["passes"]
		p.VirtioBase = vmm.VirtioBlkAddr(int(g.Params["device"]))
	case "hello":
		p.HelloFault = g.Params["hello_fault"]
	}
	return p, rate
}

// Offsets of the parameter block's words setDirtyRate reads and writes
// (vmm/guests/src/guest.h).
const (
	paramsPageDelayOffset = 0x30
	paramsTSCkHzOffset    = 0x50
)

// setDirtyRate sets the dirty guest's per-page delay for mibPerSec from
// the TSC frequency the VM wrote into the parameter block.
func setDirtyRate(mem *memory.Memory, mibPerSec uint64) error {
	khz, err := mem.Uint64(guests.ParamsAddr + paramsTSCkHzOffset)
	if err != nil {
		return fmt.Errorf("reading guest TSC frequency: %w", err)
	}
	if khz == 0 {
		khz = guests.DefaultTSCkHz
	}
	pagesPerSec := mibPerSec << 8 // 256 pages of 4 KiB per MiB
	delay := khz * 1000 / pagesPerSec
	if err := mem.PutUint64(guests.ParamsAddr+paramsPageDelayOffset, delay); err != nil {
		return fmt.Errorf("writing dirty rate: %w", err)
	}
	return nil
}
