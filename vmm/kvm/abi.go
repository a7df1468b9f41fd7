package kvm

// ioctl request numbers, from linux/kvm.h (KVMIO is 0xAE). Each encodes
// direction, argument size and number as _IO/_IOR/_IOW/_IOWR do.
const (
	kvmGetAPIVersion       = 0xAE00
	kvmCreateVM            = 0xAE01
	kvmCheckExtension      = 0xAE03
	kvmGetVCPUMmapSize     = 0xAE04
	kvmGetSupportedCPUID   = 0xC008AE05 // _IOWR(KVMIO, 0x05, struct kvm_cpuid2)
	kvmCreateVCPU          = 0xAE41
	kvmSetUserMemoryRegion = 0x4020AE46 // _IOW(KVMIO, 0x46, struct kvm_userspace_memory_region)
	kvmRun                 = 0xAE80
	kvmGetRegs             = 0x8090AE81 // _IOR(KVMIO, 0x81, struct kvm_regs)
	kvmSetRegs             = 0x4090AE82 // _IOW(KVMIO, 0x82, struct kvm_regs)
	kvmGetSregs            = 0x8138AE83 // _IOR(KVMIO, 0x83, struct kvm_sregs)
	kvmSetSregs            = 0x4138AE84 // _IOW(KVMIO, 0x84, struct kvm_sregs)
	kvmSetCPUID2           = 0x4008AE90 // _IOW(KVMIO, 0x90, struct kvm_cpuid2)
	kvmGetTSCkHz           = 0xAEA3     // _IO(KVMIO, 0xa3)
)

// APIVersion is the only KVM API version there has ever been in the
// mainline kernel (KVM_API_VERSION).
const APIVersion = 12

// Capability is a KVM_CAP_* number for KVM_CHECK_EXTENSION.
type Capability uint32

// Capabilities tern asks about.
const (
	CapUserMemory    Capability = 3   // KVM_CAP_USER_MEMORY
	CapNrVCPUs       Capability = 9   // KVM_CAP_NR_VCPUS
	CapExtCPUID      Capability = 7   // KVM_CAP_EXT_CPUID
	CapMaxVCPUs      Capability = 66  // KVM_CAP_MAX_VCPUS
	CapImmediateExit Capability = 136 // KVM_CAP_IMMEDIATE_EXIT
)

// ExitReason is kvm_run.exit_reason, why KVM_RUN returned.
type ExitReason uint32

// Exit reasons (KVM_EXIT_*).
const (
	ExitUnknown       ExitReason = 0
	ExitException     ExitReason = 1
	ExitIO            ExitReason = 2
	ExitHypercall     ExitReason = 3
	ExitDebug         ExitReason = 4
	ExitHLT           ExitReason = 5
	ExitMMIO          ExitReason = 6
	ExitIRQWindowOpen ExitReason = 7
	ExitShutdown      ExitReason = 8
	ExitFailEntry     ExitReason = 9
	ExitIntr          ExitReason = 10
	ExitInternalError ExitReason = 17
	ExitSystemEvent   ExitReason = 24
)

// exitNames is an array, not a map: a constant table the linker lays
// out, with no work when the process starts.
var exitNames = [...]string{
	ExitUnknown: "UNKNOWN", ExitException: "EXCEPTION", ExitIO: "IO",
	ExitHypercall: "HYPERCALL", ExitDebug: "DEBUG", ExitHLT: "HLT",
	ExitMMIO: "MMIO", ExitIRQWindowOpen: "IRQ_WINDOW_OPEN",
	ExitShutdown: "SHUTDOWN", ExitFailEntry: "FAIL_ENTRY", ExitIntr: "INTR",
	ExitInternalError: "INTERNAL_ERROR", ExitSystemEvent: "SYSTEM_EVENT",
}

// String names the reason as linux/kvm.h does, without the KVM_EXIT_ prefix.
func (r ExitReason) String() string {
	if int(r) < len(exitNames) && exitNames[r] != "" {
		return exitNames[r]
	}
	return "EXIT_" + itoa(uint64(r))
}

func itoa(v uint64) string {
	var b [20]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + v%10)
		v /= 10
		if v == 0 {
			return string(b[i:])
		}
	}
}

// Regs is struct kvm_regs: the general-purpose registers.
type Regs struct {
	RAX, RBX, RCX, RDX, RSI, RDI, RSP, RBP uint64
	R8, R9, R10, R11, R12, R13, R14, R15   uint64
	RIP, RFLAGS                            uint64
}

// Segment is struct kvm_segment: a segment register's hidden state.
type Segment struct {
	Base     uint64
	Limit    uint32
	Selector uint16
	Type     uint8
	Present  uint8
	DPL      uint8
	DB       uint8
	S        uint8
	L        uint8
	G        uint8
	AVL      uint8
	Unusable uint8
	_        uint8
}

// DTable is struct kvm_dtable: a GDTR or IDTR.
type DTable struct {
	Base  uint64
	Limit uint16
	_     [3]uint16
}

// Sregs is struct kvm_sregs: segments, descriptor tables, control
// registers, EFER, the APIC base and the pending-interrupt bitmap.
type Sregs struct {
	CS, DS, ES, FS, GS, SS Segment
	TR, LDT                Segment
	GDT, IDT               DTable
	CR0, CR2, CR3, CR4     uint64
	CR8                    uint64
	EFER                   uint64
	APICBase               uint64
	InterruptBitmap        [4]uint64 // (KVM_NR_INTERRUPTS + 63) / 64
}

// CPUIDEntry2 is struct kvm_cpuid_entry2: one CPUID leaf (and subleaf).
type CPUIDEntry2 struct {
	Function uint32
	Index    uint32
	Flags    uint32
	EAX      uint32
	EBX      uint32
	ECX      uint32
	EDX      uint32
	_        [3]uint32
}

// cpuid2Header is struct kvm_cpuid2 without its flexible entries array.
type cpuid2Header struct {
	Nent uint32
	_    uint32
}

// userspaceMemoryRegion is struct kvm_userspace_memory_region.
type userspaceMemoryRegion struct {
	Slot          uint32
	Flags         uint32
	GuestPhysAddr uint64
	MemorySize    uint64
	UserspaceAddr uint64
}

// runHeader is the fixed head of struct kvm_run, before the exit union at
// offset 32.
type runHeader struct {
	RequestInterruptWindow     uint8
	ImmediateExit              uint8
	_                          [6]uint8
	ExitReason                 uint32
	ReadyForInterruptInjection uint8
	IfFlag                     uint8
	Flags                      uint16
	CR8                        uint64
	APICBase                   uint64
}

// runExitOffset is where kvm_run's exit union starts.
const runExitOffset = 32

// ioExit is the io member of kvm_run's exit union (KVM_EXIT_IO).
type ioExit struct {
	Direction  uint8
	Size       uint8
	Port       uint16
	Count      uint32
	DataOffset uint64 // from the start of kvm_run
}

// mmioExit is the mmio member of kvm_run's exit union (KVM_EXIT_MMIO).
type mmioExit struct {
	PhysAddr uint64
	Data     [8]uint8
	Len      uint32
	IsWrite  uint8
	_        [3]uint8
}

// internalErrorExit is the internal member of kvm_run's exit union
// (KVM_EXIT_INTERNAL_ERROR).
type internalErrorExit struct {
	Suberror uint32
	Ndata    uint32
	Data     [16]uint64
}

// IO directions of an IO exit.
const (
	IODirIn  = 0 // KVM_EXIT_IO_IN
	IODirOut = 1 // KVM_EXIT_IO_OUT
)
