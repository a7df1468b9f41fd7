package kvm

// This file holds the kernel ABI of the interrupt, dirty-log, clock and
// vCPU-state ioctls, beside abi.go's core set. abi_state_test.go pins every
// size, offset and request number.

// ioctl request numbers, from linux/kvm.h and asm/kvm.h (x86-64).
const (
	kvmGetMSRIndexList = 0xC004AE02 // _IOWR(KVMIO, 0x02, struct kvm_msr_list)
	kvmGetDirtyLog     = 0x4010AE42 // _IOW(KVMIO, 0x42, struct kvm_dirty_log)
	kvmCreateIRQChip   = 0xAE60     // _IO(KVMIO, 0x60)
	kvmIRQLine         = 0x4008AE61 // _IOW(KVMIO, 0x61, struct kvm_irq_level)
	kvmGetIRQChip      = 0xC208AE62 // _IOWR(KVMIO, 0x62, struct kvm_irqchip)
	kvmSetIRQChip      = 0x8208AE63 // _IOR(KVMIO, 0x63, struct kvm_irqchip): _IOR, as the kernel defines it
	kvmIRQFD           = 0x4020AE76 // _IOW(KVMIO, 0x76, struct kvm_irqfd)
	kvmCreatePIT2      = 0x4040AE77 // _IOW(KVMIO, 0x77, struct kvm_pit_config)
	kvmIOEventFD       = 0x4040AE79 // _IOW(KVMIO, 0x79, struct kvm_ioeventfd)
	kvmSetClock        = 0x4030AE7B // _IOW(KVMIO, 0x7b, struct kvm_clock_data)
	kvmGetClock        = 0x8030AE7C // _IOR(KVMIO, 0x7c, struct kvm_clock_data)
	kvmGetMSRs         = 0xC008AE88 // _IOWR(KVMIO, 0x88, struct kvm_msrs)
	kvmSetMSRs         = 0x4008AE89 // _IOW(KVMIO, 0x89, struct kvm_msrs)
	kvmGetFPU          = 0x81A0AE8C // _IOR(KVMIO, 0x8c, struct kvm_fpu)
	kvmSetFPU          = 0x41A0AE8D // _IOW(KVMIO, 0x8d, struct kvm_fpu)
	kvmGetLAPIC        = 0x8400AE8E // _IOR(KVMIO, 0x8e, struct kvm_lapic_state)
	kvmSetLAPIC        = 0x4400AE8F // _IOW(KVMIO, 0x8f, struct kvm_lapic_state)
	kvmGetCPUID2       = 0xC008AE91 // _IOWR(KVMIO, 0x91, struct kvm_cpuid2)
	kvmGetMPState      = 0x8004AE98 // _IOR(KVMIO, 0x98, struct kvm_mp_state)
	kvmSetMPState      = 0x4004AE99 // _IOW(KVMIO, 0x99, struct kvm_mp_state)
	kvmGetVCPUEvents   = 0x8040AE9F // _IOR(KVMIO, 0x9f, struct kvm_vcpu_events)
	kvmSetVCPUEvents   = 0x4040AEA0 // _IOW(KVMIO, 0xa0, struct kvm_vcpu_events)
	kvmGetPIT2         = 0x8070AE9F // _IOR(KVMIO, 0x9f, struct kvm_pit_state2), on the VM fd
	kvmSetPIT2         = 0x4070AEA0 // _IOW(KVMIO, 0xa0, struct kvm_pit_state2), on the VM fd
	kvmGetDebugRegs    = 0x8080AEA1 // _IOR(KVMIO, 0xa1, struct kvm_debugregs)
	kvmSetDebugRegs    = 0x4080AEA2 // _IOW(KVMIO, 0xa2, struct kvm_debugregs)
	kvmSetTSCKHz       = 0xAEA2     // _IO(KVMIO, 0xa2)
	kvmGetTSCKHz       = 0xAEA3     // _IO(KVMIO, 0xa3)
	kvmEnableCap       = 0x4068AEA3 // _IOW(KVMIO, 0xa3, struct kvm_enable_cap)
	kvmGetXSAVE        = 0x9000AEA4 // _IOR(KVMIO, 0xa4, struct kvm_xsave)
	kvmSetXSAVE        = 0x5000AEA5 // _IOW(KVMIO, 0xa5, struct kvm_xsave)
	kvmGetXCRs         = 0x8188AEA6 // _IOR(KVMIO, 0xa6, struct kvm_xcrs)
	kvmSetXCRs         = 0x4188AEA7 // _IOW(KVMIO, 0xa7, struct kvm_xcrs)
	kvmClearDirtyLog   = 0xC018AEC0 // _IOWR(KVMIO, 0xc0, struct kvm_clear_dirty_log)
	kvmResetDirtyRings = 0xAEC7     // _IO(KVMIO, 0xc7)
	kvmGetXSAVE2       = 0x9000AECF // _IOR(KVMIO, 0xcf, struct kvm_xsave)
)

// More capabilities (KVM_CAP_*).
const (
	CapIRQChip                Capability = 0   // KVM_CAP_IRQCHIP
	CapMPState                Capability = 14  // KVM_CAP_MP_STATE
	CapIRQFD                  Capability = 32  // KVM_CAP_IRQFD
	CapPIT2                   Capability = 33  // KVM_CAP_PIT2
	CapIOEventFD              Capability = 36  // KVM_CAP_IOEVENTFD
	CapAdjustClock            Capability = 39  // KVM_CAP_ADJUST_CLOCK
	CapVCPUEvents             Capability = 41  // KVM_CAP_VCPU_EVENTS
	CapDebugRegs              Capability = 50  // KVM_CAP_DEBUGREGS
	CapEnableCap              Capability = 54  // KVM_CAP_ENABLE_CAP (vCPU)
	CapXSAVE                  Capability = 55  // KVM_CAP_XSAVE
	CapXCRs                   Capability = 56  // KVM_CAP_XCRS
	CapTSCControl             Capability = 60  // KVM_CAP_TSC_CONTROL
	CapGetTSCKHz              Capability = 61  // KVM_CAP_GET_TSC_KHZ
	CapTSCDeadlineTimer       Capability = 72  // KVM_CAP_TSC_DEADLINE_TIMER
	CapEnableCapVM            Capability = 98  // KVM_CAP_ENABLE_CAP_VM
	CapManualDirtyLogProtect2 Capability = 168 // KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2
	CapDirtyLogRing           Capability = 192 // KVM_CAP_DIRTY_LOG_RING
	CapXSAVE2                 Capability = 208 // KVM_CAP_XSAVE2
	CapDirtyLogRingAcqRel     Capability = 223 // KVM_CAP_DIRTY_LOG_RING_ACQ_REL
	CapDirtyLogRingWithBitmap Capability = 225 // KVM_CAP_DIRTY_LOG_RING_WITH_BITMAP
)

// dirtyLogManualProtectEnable is KVM_DIRTY_LOG_MANUAL_PROTECT_ENABLE, the
// flag of KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2 tern enables.
const dirtyLogManualProtectEnable = 1 << 0

// ExitDirtyRingFull is KVM_EXIT_DIRTY_RING_FULL: a vCPU's dirty ring is
// full; harvest and reset the rings before running it again.
const ExitDirtyRingFull ExitReason = 31

// MemLogDirtyPages is the KVM_MEM_LOG_DIRTY_PAGES flag of a memory slot:
// KVM logs the guest's writes to it in the dirty bitmap or the dirty ring.
const MemLogDirtyPages = 1 << 0

// irqLevel is struct kvm_irq_level (the irq member of its union).
type irqLevel struct {
	IRQ   uint32
	Level uint32
}

// pitConfig is struct kvm_pit_config.
type pitConfig struct {
	Flags uint32
	_     [15]uint32
}

// irqfdArg is struct kvm_irqfd.
type irqfdArg struct {
	FD         uint32
	GSI        uint32
	Flags      uint32
	ResampleFD uint32
	_          [16]uint8
}

// KVM_IRQFD flags.
const irqfdFlagDeassign = 1 << 0

// ioeventfdArg is struct kvm_ioeventfd.
type ioeventfdArg struct {
	Datamatch uint64
	Addr      uint64
	Len       uint32
	FD        int32
	Flags     uint32
	_         [36]uint8
}

// KVM_IOEVENTFD flags.
const (
	ioeventfdFlagDatamatch = 1 << 0
	ioeventfdFlagPIO       = 1 << 1
	ioeventfdFlagDeassign  = 1 << 2
)

// enableCapArg is struct kvm_enable_cap.
type enableCapArg struct {
	Cap   uint32
	Flags uint32
	Args  [4]uint64
	_     [64]uint8
}

// FPU is struct kvm_fpu: the x87 and SSE state in FXSAVE form. KVM
// neither reports nor sets MXCSR through it (the field reads 0): only the
// XSAVE area carries MXCSR.
type FPU struct {
	FPR        [8][16]uint8
	FCW        uint16
	FSW        uint16
	FTWX       uint8
	_          uint8
	LastOpcode uint16
	LastIP     uint64
	LastDP     uint64
	XMM        [16][16]uint8
	MXCSR      uint32
	_          uint32
}

// MSREntry is struct kvm_msr_entry: one model-specific register.
type MSREntry struct {
	Index uint32
	_     uint32
	Data  uint64
}

// msrsHeader is struct kvm_msrs without its flexible entries array.
type msrsHeader struct {
	NMSRs uint32
	_     uint32
}

// msrListHeader is struct kvm_msr_list without its flexible indices.
type msrListHeader struct {
	NMSRs uint32
}

// xsaveLegacySize is sizeof(struct kvm_xsave) without its flexible tail:
// the buffer of KVM_GET_XSAVE and the least KVM_SET_XSAVE reads.
const xsaveLegacySize = 4096

// XCR is struct kvm_xcr: one extended control register (XCR0 is the
// XSAVE feature mask).
type XCR struct {
	XCR   uint32
	_     uint32
	Value uint64
}

// maxXCRs is KVM_MAX_XCRS.
const maxXCRs = 16

// xcrsArg is struct kvm_xcrs.
type xcrsArg struct {
	NrXCRs uint32
	Flags  uint32
	XCRs   [maxXCRs]XCR
	_      [16]uint64
}

// IRQChipState is struct kvm_irqchip: one in-kernel interrupt controller,
// ChipID IRQChipPICMaster, IRQChipPICSlave or IRQChipIOAPIC, and its
// registers as the kernel lays them out (struct kvm_pic_state or
// kvm_ioapic_state in the 512-byte union), carried opaquely: they are the
// kernel's ABI and move between hosts byte for byte.
type IRQChipState struct {
	ChipID uint32
	_      uint32
	Chip   [512]byte
}

// The chip IDs of IRQChipState.
const (
	IRQChipPICMaster = 0
	IRQChipPICSlave  = 1
	IRQChipIOAPIC    = 2
)

// PITState is struct kvm_pit_state2: the in-kernel i8254's three
// channels and its flags, carried opaquely as IRQChipState is (the kernel
// reloads each channel's count, and its own load time, on KVM_SET_PIT2).
type PITState struct {
	State [112]byte
}

// LAPICState is struct kvm_lapic_state: the local APIC's 1 KiB register
// page.
type LAPICState struct {
	Regs [0x400]uint8
}

// VCPUEvents is struct kvm_vcpu_events: pending and injected exceptions,
// interrupts, NMIs and SMIs, and the interrupt shadow.
type VCPUEvents struct {
	Exception  ExceptionEvent
	Interrupt  InterruptEvent
	NMI        NMIEvent
	SIPIVector uint32
	// Flags are KVM_VCPUEVENT_VALID_*: which optional fields are valid.
	Flags uint32
	SMI   SMIEvent
	// TripleFaultPending is valid with KVM_VCPUEVENT_VALID_TRIPLE_FAULT.
	TripleFaultPending  uint8
	_                   [26]uint8
	ExceptionHasPayload uint8
	ExceptionPayload    uint64
}

// ExceptionEvent is the exception member of struct kvm_vcpu_events.
type ExceptionEvent struct {
	Injected     uint8
	Nr           uint8
	HasErrorCode uint8
	Pending      uint8
	ErrorCode    uint32
}

// InterruptEvent is the interrupt member of struct kvm_vcpu_events.
type InterruptEvent struct {
	Injected uint8
	Nr       uint8
	Soft     uint8
	Shadow   uint8
}

// NMIEvent is the nmi member of struct kvm_vcpu_events.
type NMIEvent struct {
	Injected uint8
	Pending  uint8
	Masked   uint8
	_        uint8
}

// SMIEvent is the smi member of struct kvm_vcpu_events.
type SMIEvent struct {
	SMM          uint8
	Pending      uint8
	SMMInsideNMI uint8
	LatchedInit  uint8
}

// DebugRegs is struct kvm_debugregs: DR0-DR3, DR6 and DR7.
type DebugRegs struct {
	DB    [4]uint64
	DR6   uint64
	DR7   uint64
	Flags uint64
	_     [9]uint64
}

// MPState is struct kvm_mp_state's value (KVM_MP_STATE_*).
type MPState uint32

// MP states of x86 vCPUs.
const (
	MPStateRunnable      MPState = 0
	MPStateUninitialized MPState = 1
	MPStateInitReceived  MPState = 2
	MPStateHalted        MPState = 3
	MPStateSIPIReceived  MPState = 4
)

// ClockData is struct kvm_clock_data: the VM's kvmclock.
type ClockData struct {
	// Clock is the kvmclock value in nanoseconds.
	Clock uint64
	// Flags are KVM_CLOCK_*: which of the fields below are valid.
	Flags    uint32
	_        uint32
	Realtime uint64
	HostTSC  uint64
	_        [4]uint32
}

// Clock flags (KVM_CLOCK_*).
const (
	ClockTSCStable = 2      // KVM_CLOCK_TSC_STABLE
	ClockRealtime  = 1 << 2 // KVM_CLOCK_REALTIME
	ClockHostTSC   = 1 << 3 // KVM_CLOCK_HOST_TSC
)

// dirtyGFN is struct kvm_dirty_gfn: one dirty-ring entry.
type dirtyGFN struct {
	Flags  uint32
	Slot   uint32
	Offset uint64
}

// Dirty-ring entry flags (KVM_DIRTY_GFN_F_*).
const (
	dirtyGFNFlagDirty = 1 << 0
	dirtyGFNFlagReset = 1 << 1
)

// dirtyLogPageOffset is KVM_DIRTY_LOG_PAGE_OFFSET on x86: the page of the
// vCPU fd where the dirty ring is mapped.
const dirtyLogPageOffset = 64
