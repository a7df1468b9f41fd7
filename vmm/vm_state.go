package vmm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"tern/vmm/devices"
	"tern/vmm/kvm"
)

// DeviceState is one entry of a VM's saved state: the bytes of a device,
// a vCPU or the clock under the kind and version of their encoding.
// Outside the vmm packages it is opaque; a migration carries it as is.
type DeviceState struct {
	Kind    string
	Version uint16
	Payload []byte
}

// The kinds of the VM's own entries (its devices' are vmm/devices'), each
// at version 1:
//
//   - vcpu: the vCPU's id (uint32), then kvm.VCPUState's binary form.
//   - clock: the host's realtime at capture in nanoseconds (int64),
//     whether KVM keeps a kvmclock (one byte), and its data: clock
//     (uint64), flags (uint32), realtime and host TSC (uint64).
//   - irqchip: the in-kernel interrupt controller of a Linux guest or
//     the smp guest, its chip ID (uint32) then the kernel's 512 bytes
//     (KVM's ABI, the same on every x86-64 host); one per chip.
//   - pit: a Linux guest's i8254, struct kvm_pit_state2's 112 bytes.
//
// A disk's or a network card's transport (devices.VirtioBlkStateKind,
// devices.VirtioNetStateKind) is preceded by its slot (uint16: vda is 0,
// the first card 0). Every integer is little-endian.
const (
	vcpuStateKind    = "vcpu"
	clockStateKind   = "clock"
	irqChipStateKind = "irqchip"
	pitStateKind     = "pit"
	vmStateVersion   = 1
)

// Payload sizes of the fixed-size entries.
const (
	clockStateSize   = 8 + 1 + 8 + 4 + 8 + 8
	irqChipStateSize = 4 + 512
	pitStateSize     = 112
	slotPrefixSize   = 2
)

// DeviceStateVersions returns, for every kind of entry SaveState writes,
// the versions RestoreState reads, lowest first.
func DeviceStateVersions() map[string][]uint16 {
	out := map[string][]uint16{}
	for _, k := range []string{vcpuStateKind, clockStateKind, irqChipStateKind, pitStateKind} {
		out[k] = devices.ReadsStateVersions(vmStateVersion)
	}
	for k, v := range devices.StateVersions() {
		out[k] = devices.ReadsStateVersions(v)
	}
	return out
}

// statefulSet is a kind of the VM's Stateful devices: one device (the
// UART) or one per slot (the disks), whose payloads then start with the
// slot.
type statefulSet struct {
	kind    string
	slotted bool
	devs    []devices.Stateful
}

// statefulDevices returns every Stateful device of the VM, by kind, in
// the order they are saved and restored.
func (vm *VM) statefulDevices() []statefulSet {
	disks := make([]devices.Stateful, len(vm.virtioBlks))
	for i, t := range vm.virtioBlks {
		disks[i] = t
	}
	cards := make([]devices.Stateful, len(vm.nics))
	for i, n := range vm.nics {
		cards[i] = n.Transport()
	}
	return []statefulSet{
		{kind: devices.UARTStateKind, devs: []devices.Stateful{vm.uart}},
		{kind: devices.HistoryStateKind, devs: []devices.Stateful{vm.uart.Output()}},
		{kind: devices.BootTimerStateKind, devs: []devices.Stateful{vm.bootTimer}},
		{kind: devices.VirtioBlkStateKind, slotted: true, devs: disks},
		{kind: devices.VirtioNetStateKind, slotted: true, devs: cards},
	}
}

// SaveState captures the paused VM (Pause, and for a Linux guest
// QuiesceVirtio): every vCPU (its local APIC, pending events and MP state
// among it), the irqchips and a Linux guest's PIT, the
// clock, and every Stateful device. A vCPU parked at HLT (an application
// processor) is saved at its HLT, so the VM it is restored into parks it
// again.
func (vm *VM) SaveState() ([]DeviceState, error) {
	out, err := vm.saveState()
	if err != nil {
		return nil, fmt.Errorf("saving the VM's state: %w", err)
	}
	return out, nil
}

func (vm *VM) saveState() ([]DeviceState, error) {
	spec, err := vm.kvm.StateSpec()
	if err != nil {
		return nil, err
	}
	var out []DeviceState
	for _, c := range vm.KVMVCPUs() {
		st, err := c.SaveState(spec)
		if err != nil {
			return nil, err
		}
		if c.ExitReason() == kvm.ExitHLT {
			st.Regs.RIP--
		}
		p, err := st.MarshalBinary()
		if err != nil {
			return nil, err
		}
		out = append(out, DeviceState{Kind: vcpuStateKind, Version: vmStateVersion,
			Payload: append(binary.LittleEndian.AppendUint32(nil, uint32(c.ID())), p...)})
	}
	clk := clockState{RealtimeNs: time.Now().UnixNano()}
	if d, err := vm.kvm.Clock(); err == nil {
		clk.HasKVM, clk.KVM = true, d
	} else if !errors.Is(err, kvm.ErrNotSupported) {
		return nil, err
	}
	plat, err := vm.PlatformState()
	if err != nil {
		return nil, err
	}
	if plat != nil {
		for _, c := range plat.IRQChips {
			p := binary.LittleEndian.AppendUint32(nil, c.ChipID)
			out = append(out, DeviceState{Kind: irqChipStateKind, Version: vmStateVersion, Payload: append(p, c.Chip[:]...)})
		}
		if plat.PIT != nil {
			out = append(out, DeviceState{Kind: pitStateKind, Version: vmStateVersion, Payload: append([]byte(nil), plat.PIT.State[:]...)})
		}
	}
	out = append(out, DeviceState{Kind: clockStateKind, Version: vmStateVersion, Payload: clk.encode()})
	for _, set := range vm.statefulDevices() {
		for slot, d := range set.devs {
			p, err := d.SaveState()
			if err != nil {
				return nil, fmt.Errorf("saving %s %d: %w", set.kind, slot, err)
			}
			if set.slotted {
				p = append(binary.LittleEndian.AppendUint16(nil, uint16(slot)), p...)
			}
			out = append(out, DeviceState{Kind: set.kind, Version: d.StateVersion(), Payload: p})
		}
	}
	return out, nil
}

// RestoreState loads what SaveState captured into a VM built from the
// same config without its boot image (NewMigrationTarget), paused before
// Run. It reads every entry and checks that together they describe this
// VM before it loads anything, then loads them in the order they depend
// on: the clock (guest time moves on by the host time since the capture,
// never back), the irqchips and a Linux guest's PIT before the local
// APICs they feed, the vCPUs, then the devices. A Linux guest's transports stay
// quiesced until ResumeVirtio, so what the source was notified of is
// served only once the guest runs here.
//
// An entry of a kind or version this tern does not read is
// devices.ErrUnknownState, one that does not decode
// devices.ErrMalformedState, and entries of another VM (another vCPU
// count, disk or card count, a missing clock) devices.ErrStateMismatch.
// On an error the VM is partly loaded and must not run.
func (vm *VM) RestoreState(list []DeviceState) error {
	if err := vm.restoreState(list); err != nil {
		return fmt.Errorf("restoring the VM's state: %w", err)
	}
	vm.note("restored from a migration")
	return nil
}

// savedVM is a VM's state as read, before it is loaded.
type savedVM struct {
	clock    *clockState
	cpus     map[uint32]*kvm.VCPUState
	platform PlatformState
	chips    [3]bool
	pits     int
	// devices are the device entries, each with the device it loads into.
	devices []savedDevice
}

type savedDevice struct {
	dev     devices.Stateful
	version uint16
	payload []byte
}

func (vm *VM) restoreState(list []DeviceState) error {
	s, err := vm.readState(list)
	if err != nil {
		return err
	}
	delta := max(time.Now().UnixNano()-s.clock.RealtimeNs, 0)
	if s.clock.HasKVM {
		d := s.clock.KVM
		if d.Flags&kvm.ClockRealtime == 0 {
			d.Clock += uint64(delta)
		}
		if err := vm.kvm.SetClock(d); err != nil && !errors.Is(err, kvm.ErrNotSupported) {
			return fmt.Errorf("loading the clock: %w", err)
		}
	}
	if vm.irqchip {
		if err := vm.SetPlatformState(&s.platform); err != nil {
			return err
		}
	}
	if vm.linux {
		if err := vm.QuiesceVirtio(context.Background()); err != nil { // fresh transports: nothing to wait for
			return err
		}
	}
	spec, err := vm.kvm.StateSpec()
	if err != nil {
		return fmt.Errorf("loading vCPU state: %w", err)
	}
	for i, c := range vm.KVMVCPUs() {
		st := s.cpus[uint32(i)]
		restoreTRAvailableOnAMD(c, st)
		advanceTSC(st, delta)
		dropUnchangedMSRs(c, st)
		if err := c.RestoreState(st, spec); err != nil {
			return fmt.Errorf("loading vCPU state: %w", err)
		}
	}
	for _, d := range s.devices {
		if err := d.dev.RestoreState(d.version, d.payload); err != nil {
			return err
		}
	}
	return nil
}

// readState reads list and checks it describes this VM.
func (vm *VM) readState(list []DeviceState) (*savedVM, error) {
	s := &savedVM{cpus: map[uint32]*kvm.VCPUState{}}
	nCPUs := len(vm.VCPUs())
	sets := map[string]statefulSet{}
	seen := map[string]map[uint16]bool{}
	for _, set := range vm.statefulDevices() {
		sets[set.kind], seen[set.kind] = set, map[uint16]bool{}
	}
	for _, e := range list {
		if set, ok := sets[e.Kind]; ok {
			d, err := set.entry(e, seen[e.Kind])
			if err != nil {
				return nil, err
			}
			s.devices = append(s.devices, d)
			continue
		}
		if err := s.readOwn(e, nCPUs); err != nil {
			return nil, err
		}
	}
	if len(s.cpus) != nCPUs || s.clock == nil {
		return nil, fmt.Errorf("%w: %d of %d vCPUs, clock %v", devices.ErrStateMismatch, len(s.cpus), nCPUs, s.clock != nil)
	}
	nChips := 0
	for _, c := range s.chips {
		if c {
			nChips++
		}
	}
	wantChips, wantPITs := 0, 0
	if vm.irqchip {
		wantChips = len(s.chips)
	}
	if vm.linux {
		wantPITs = 1
	}
	if nChips != wantChips || s.pits != wantPITs {
		return nil, fmt.Errorf("%w: %d irqchips and %d PITs for a VM with %d and %d (a Linux guest has 3 and 1, the smp guest 3 and 0, tern's other guests none)",
			devices.ErrStateMismatch, nChips, s.pits, wantChips, wantPITs)
	}
	for kind, set := range sets {
		if set.slotted && len(seen[kind]) != len(set.devs) {
			return nil, fmt.Errorf("%w: the source has %d of %s, this VM %d", devices.ErrStateMismatch, len(seen[kind]), kind, len(set.devs))
		}
	}
	return s, nil
}

// entry returns what loads e into its device of the set; seen are the
// slots read so far.
func (set statefulSet) entry(e DeviceState, seen map[uint16]bool) (savedDevice, error) {
	p, slot := e.Payload, uint16(0)
	if set.slotted {
		if len(p) < slotPrefixSize {
			return savedDevice{}, fmt.Errorf("%w: %s of %d bytes", devices.ErrMalformedState, e.Kind, len(p))
		}
		slot, p = binary.LittleEndian.Uint16(p), p[slotPrefixSize:]
		if seen[slot] {
			return savedDevice{}, fmt.Errorf("%w: %s %d twice", devices.ErrStateMismatch, e.Kind, slot)
		}
		seen[slot] = true
	}
	if int(slot) >= len(set.devs) {
		return savedDevice{}, fmt.Errorf("%w: the source has %s %d, this VM %d of them", devices.ErrStateMismatch, e.Kind, slot, len(set.devs))
	}
	d := set.devs[slot]
	if err := devices.CheckStateVersion(e.Kind, d.StateVersion(), e.Version); err != nil {
		return savedDevice{}, err
	}
	return savedDevice{dev: d, version: e.Version, payload: p}, nil
}

// readOwn reads one of the VM's own entries (vCPU, clock, irqchip, PIT)
// into s.
func (s *savedVM) readOwn(e DeviceState, nCPUs int) error {
	switch e.Kind {
	case vcpuStateKind, clockStateKind, irqChipStateKind, pitStateKind:
	default:
		return fmt.Errorf("%w: kind %q", devices.ErrUnknownState, e.Kind)
	}
	if err := devices.CheckStateVersion(e.Kind, vmStateVersion, e.Version); err != nil {
		return err
	}
	switch e.Kind {
	case vcpuStateKind:
		id, st, err := decodeVCPUState(e.Payload)
		if err != nil {
			return err
		}
		if int(id) >= nCPUs || s.cpus[id] != nil {
			return fmt.Errorf("%w: vCPU %d of %d, or twice", devices.ErrStateMismatch, id, nCPUs)
		}
		s.cpus[id] = st
	case clockStateKind:
		c, err := decodeClockState(e.Payload)
		if err != nil {
			return err
		}
		s.clock = &c
	case irqChipStateKind:
		c, err := decodeIRQChipState(e.Payload)
		if err != nil {
			return err
		}
		if s.chips[c.ChipID] {
			return fmt.Errorf("%w: irqchip %d twice", devices.ErrStateMismatch, c.ChipID)
		}
		s.chips[c.ChipID], s.platform.IRQChips[c.ChipID] = true, c
	case pitStateKind:
		if len(e.Payload) != pitStateSize {
			return fmt.Errorf("%w: pit of %d bytes, want %d", devices.ErrMalformedState, len(e.Payload), pitStateSize)
		}
		s.platform.PIT = &kvm.PITState{}
		copy(s.platform.PIT.State[:], e.Payload)
		s.pits++
	}
	return nil
}

// clockState is the source's time at capture: host realtime, and the
// kvmclock when KVM has one.
type clockState struct {
	RealtimeNs int64
	HasKVM     bool
	KVM        kvm.ClockData
}

func (c clockState) encode() []byte {
	p := binary.LittleEndian.AppendUint64(nil, uint64(c.RealtimeNs))
	if c.HasKVM {
		p = append(p, 1)
	} else {
		p = append(p, 0)
	}
	p = binary.LittleEndian.AppendUint64(p, c.KVM.Clock)
	p = binary.LittleEndian.AppendUint32(p, c.KVM.Flags)
	p = binary.LittleEndian.AppendUint64(p, c.KVM.Realtime)
	return binary.LittleEndian.AppendUint64(p, c.KVM.HostTSC)
}

func decodeClockState(p []byte) (clockState, error) {
	if len(p) != clockStateSize {
		return clockState{}, fmt.Errorf("%w: clock of %d bytes, want %d", devices.ErrMalformedState, len(p), clockStateSize)
	}
	le := binary.LittleEndian
	c := clockState{RealtimeNs: int64(le.Uint64(p)), HasKVM: p[8] != 0}
	c.KVM.Clock, c.KVM.Flags, c.KVM.Realtime, c.KVM.HostTSC = le.Uint64(p[9:]), le.Uint32(p[17:]), le.Uint64(p[21:]), le.Uint64(p[29:])
	return c, nil
}

func decodeVCPUState(p []byte) (uint32, *kvm.VCPUState, error) {
	if len(p) < 4 {
		return 0, nil, fmt.Errorf("%w: vcpu of %d bytes", devices.ErrMalformedState, len(p))
	}
	st := &kvm.VCPUState{}
	if err := st.UnmarshalBinary(p[4:]); err != nil {
		return 0, nil, fmt.Errorf("%w: vcpu: %w", devices.ErrMalformedState, err)
	}
	return binary.LittleEndian.Uint32(p), st, nil
}

// decodeIRQChipState reads an irqchip entry; a chip ID past the IOAPIC's
// is malformed.
func decodeIRQChipState(p []byte) (kvm.IRQChipState, error) {
	var c kvm.IRQChipState
	if len(p) != irqChipStateSize {
		return c, fmt.Errorf("%w: irqchip of %d bytes, want %d", devices.ErrMalformedState, len(p), irqChipStateSize)
	}
	c.ChipID = binary.LittleEndian.Uint32(p)
	if c.ChipID > kvm.IRQChipIOAPIC {
		return c, fmt.Errorf("%w: irqchip %d: KVM has chips 0 to %d", devices.ErrMalformedState, c.ChipID, kvm.IRQChipIOAPIC)
	}
	copy(c.Chip[:], p[4:])
	return c, nil
}

// TSS descriptor types of a 64-bit TR.
const (
	trTypeAvailable = 9
	trTypeBusy      = 11
)

// restoreTRAvailableOnAMD restores a busy 64-bit TR as available on an
// AMD host. KVM on SVM reports a loaded TR as busy whatever the VMCB holds
// (it ORs the busy bit in), SVM checks no TR type, and QEMU's TCG — the
// emulated test host's CPU — honours the IO-permission bitmap only of an
// available TR, so a guest doing port IO at CPL3 through its TSS's bitmap
// would #GP after the restore. Intel's VM entry requires a busy TR, so on
// any other vendor it stays as saved.
func restoreTRAvailableOnAMD(c *kvm.VCPU, st *kvm.VCPUState) {
	if st.Sregs.TR.Type != trTypeBusy {
		return
	}
	entries, err := c.CPUID2()
	if err != nil {
		return
	}
	for _, e := range entries {
		// "AuthenticAMD" in EBX, EDX, ECX of leaf 0.
		if e.Function == 0 && e.EBX == 0x68747541 && e.EDX == 0x69746e65 && e.ECX == 0x444d4163 {
			st.Sregs.TR.Type = trTypeAvailable
			return
		}
	}
}

// advanceTSC moves the saved TSC on by deltaNs at the vCPU's frequency.
func advanceTSC(st *kvm.VCPUState, deltaNs int64) {
	if st.TSCKHz == 0 {
		return
	}
	for i := range st.MSRs {
		if st.MSRs[i].Index == kvm.MSRIA32TSC {
			st.MSRs[i].Data += uint64(deltaNs/1000) * uint64(st.TSCKHz) / 1000
		}
	}
}

// dropUnchangedMSRs leaves out of st the MSRs the target vCPU already
// holds with the same value: restoring them changes nothing, and some
// KVMs (nested PVM) list paravirtual MSRs as readable that they refuse to
// have written, even with their own value.
func dropUnchangedMSRs(c *kvm.VCPU, st *kvm.VCPUState) {
	kept := st.MSRs[:0:0]
	for _, e := range st.MSRs {
		cur, err := c.MSRs([]uint32{e.Index})
		if err == nil && len(cur) == 1 && cur[0].Data == e.Data {
			continue
		}
		kept = append(kept, e)
	}
	st.MSRs = kept
}
