package guests

import "encoding/binary"

// ParamsAddr is the guest-physical address of the parameter block.
const ParamsAddr = 0x8000

// paramsMagic is "TERNPARM" read as a little-endian u64.
const paramsMagic = 0x4d5241504e524554

// paramsVersion is the layout version the guests accept.
const paramsVersion = 1

// ParamsSize is the size in bytes of the encoded parameter block,
// including the dirty guest's verify request and acknowledgement words.
// Fields were only ever added (into the unused word at 0x50 and at the
// end), each zero meaning the default, so the version stays 1 and a host
// that writes a shorter block still works: guest RAM it leaves alone is
// zero.
const ParamsSize = 0xa0

// Params is the host's side of the parameter block (src/guest.h). A zero
// field means the guest's default.
type Params struct {
	// MemStart and MemBytes bound the dirty guest's patterned area
	// (default 16 MiB at 4 MiB).
	MemStart, MemBytes uint64
	// WorkingSetBytes is how much of it the dirty guest rewrites per pass
	// (default 1 MiB).
	WorkingSetBytes uint64
	// Passes is the dirty guest's number of rewrite passes (default 16)
	// and the disk guest's of write-and-verify passes (default 1);
	// PassesForever makes either run until stopped.
	Passes uint64
	// PageDelayTSC is how many TSC ticks the dirty guest waits after each
	// page it rewrites (default 0): it sets the dirtying rate.
	PageDelayTSC uint64
	// Seed is the disk and demo guests' pattern seed (default
	// 0x7465726e).
	Seed uint64
	// Sectors is how many 512-byte sectors the disk guest writes and
	// verifies (default 256), or the demo guest each round (default
	// DefaultDemoSectorsPerRound, at most MaxDemoSectorsPerRound); both
	// cap it at the disk's capacity.
	Sectors uint64
	// VirtioBase is the disk and demo guests' virtio-mmio base address;
	// zero scans QEMU microvm's slots from 0xfeb00000.
	VirtioBase uint64
	// TSCkHz is the guest's TSC frequency, which the host knows
	// (KVM_GET_TSC_KHZ); without it the guests assume DefaultTSCkHz. It
	// scales the times and rates they print, the dirty guest's
	// verification interval, the demo guest's one-second rounds and the
	// echo and demo guests' polling interval.
	TSCkHz uint64
	// VerifyEverySec is how many seconds of dirtying the dirty guest does
	// between verifications of its whole pattern (default 1).
	VerifyEverySec uint64
	// HelloFault makes the hello guest raise an exception on purpose after
	// its line (see the HelloFault constants); zero does not.
	HelloFault uint64
	// Idle makes the dirty guest fill its pattern once and then dirty
	// nothing: it still watches the clock (printing its progress gaps),
	// verifies every VerifyEverySec (after "dirty: rate 0 MiB/s") and on
	// request, and a bounded run ends after Passes such intervals.
	Idle bool
	// VCPUs is the smp guest's number of CPUs, the VM's vCPUs (default
	// 1, at most SMPMaxCPUs); tern fills it in when 0.
	VCPUs uint64
	// APHold makes the smp guest hold its application processors' start
	// until the host sets the word at APGoOffset (SMPHoldBeforeINIT,
	// SMPHoldBeforeSIPI); zero starts them at once.
	APHold uint64
}

// Values of Params.APHold: where the smp guest's BSP waits for the word at
// APGoOffset before it goes on starting its application processors.
const (
	// SMPHoldBeforeINIT holds before the INIT: the APs wait in KVM's
	// reset state (KVM_MP_STATE_UNINITIALIZED).
	SMPHoldBeforeINIT = 1
	// SMPHoldBeforeSIPI sends the INIT and holds before the start-up
	// IPIs: the APs wait for them (KVM_MP_STATE_INIT_RECEIVED).
	SMPHoldBeforeSIPI = 2
)

// SMPMaxCPUs is the most CPUs the smp guest runs on.
const SMPMaxCPUs = 4

// APGoOffset is the parameter block's word a host sets (non-zero) to
// release the smp guest's hold (Params.APHold). Encode leaves it zero.
const APGoOffset = 0x98

// DefaultTSCkHz is the TSC frequency the guests assume when Params.TSCkHz
// is 0.
const DefaultTSCkHz = 2_000_000

// Values of Params.HelloFault: the exception hello raises at CPL3.
const (
	HelloFaultDivide       = 1 // #DE: divide by zero
	HelloFaultInvalidOp    = 2 // #UD: ud2
	HelloFaultNonCanonical = 3 // #GP: a load from a non-canonical address
	HelloFaultPage         = 4 // #PF: a load from unmapped 0x100000000
	HelloFaultPort         = 5 // #GP: a port the TSS's IO bitmap denies
	// HelloFaultTriple is a triple fault: the handler of a ud2 loads an
	// empty IDT and faults again at CPL0, and the CPU shuts down
	// (KVM_EXIT_SHUTDOWN) with nothing printed.
	HelloFaultTriple = 6
)

// ExceptionStatus is the exit status of a guest that took the exception
// vector: its handler prints one line and exits with 0x40 + vector.
func ExceptionStatus(vector uint8) uint8 { return 0x40 + vector }

// PassesForever makes the dirty guest rewrite its working set until it is
// stopped; it verifies every VerifyEverySec and whenever the
// verify-request word changes.
const PassesForever = ^uint64(0)

// Offsets in the parameter block of the dirty guest's verify handshake:
// the host changes the request word, the guest verifies within 64 pages
// of dirtying, prints the result, and copies the request to the ack word.
const (
	VerifyRequestOffset = 0x58
	VerifyAckOffset     = 0x60
)

// MarkOffset is the parameter block's mark word: a host that sets it to
// UDPMark(used) while the udp guest is paused (a migration's target,
// before it resumes) makes the stall that pause was the guest's marked
// stall (UDPReport.MarkedStall). Encode leaves it zero.
const MarkOffset = 0x80

// UDPMark is the mark word for a pause at which the udp guest's card had
// published used as its receive queue's used index: the frames below it
// arrived before the pause, whenever the guest takes them in.
func UDPMark(used uint16) uint64 { return 1<<16 | uint64(used) }

// Encode returns the parameter block's bytes, to be written at ParamsAddr.
func (p Params) Encode() []byte {
	b := make([]byte, ParamsSize)
	le := binary.LittleEndian
	for i, v := range []uint64{paramsMagic, paramsVersion, p.MemStart, p.MemBytes,
		p.WorkingSetBytes, p.Passes, p.PageDelayTSC, p.Seed, p.Sectors, p.VirtioBase, p.TSCkHz} {
		le.PutUint64(b[8*i:], v)
	}
	le.PutUint64(b[0x68:], p.VerifyEverySec)
	le.PutUint64(b[0x70:], p.HelloFault)
	if p.Idle {
		le.PutUint64(b[0x78:], 1)
	}
	le.PutUint64(b[0x88:], p.VCPUs)
	le.PutUint64(b[0x90:], p.APHold)
	return b
}

// DefaultDiskSeed is the disk guest's pattern seed when Params.Seed is 0.
const DefaultDiskSeed = 0x7465726e

// DiskPattern returns the 512 bytes the disk guest writes to sector, so a
// test can check a disk's contents from outside the guest.
func DiskPattern(seed, sector uint64) []byte {
	b := make([]byte, 512)
	for w := uint64(0); w < 64; w++ {
		x := seed ^ (sector * 0x9e3779b97f4a7c15) ^ (w << 32)
		x ^= x >> 33
		x *= 0xff51afd7ed558ccd
		x ^= x >> 33
		binary.LittleEndian.PutUint64(b[8*w:], x)
	}
	return b
}

// The demo guest's rounds: round R (from 1) writes SectorsPerRound
// sectors from DemoRoundFirstSector, each holding DemoPattern.
const (
	// DefaultDemoSectorsPerRound is how many sectors each of demo's rounds
	// writes when Params.Sectors is 0.
	DefaultDemoSectorsPerRound = 4
	// MaxDemoSectorsPerRound caps Params.Sectors for demo (and the disk's
	// capacity caps it too).
	MaxDemoSectorsPerRound = 8
	// demoRoundMix folds the round into the seed (ROUND_MIX in
	// src/demo.c).
	demoRoundMix = 0xc2b2ae3d27d4eb4f
)

// DemoRoundFirstSector returns the first sector demo's round writes, for
// perRound sectors a round on a disk of capacity sectors: the rounds walk
// the disk's whole slots of perRound sectors and wrap.
func DemoRoundFirstSector(round, perRound, capacity uint64) uint64 {
	return (round - 1) * perRound % (capacity - capacity%perRound)
}

// DemoPattern returns the 512 bytes demo's round writes to sector, so a
// test can check a disk's contents from outside the guest: the disk
// guest's pattern with the round folded into the seed.
func DemoPattern(seed, sector, round uint64) []byte {
	return DiskPattern(seed^round*demoRoundMix, sector)
}

// QEMUMachineArgs returns the arguments that make QEMU run a built-in
// guest: the microvm machine on the qboot firmware, which boots
// -kernel's PVH entry and leaves low memory alone. The machine's default
// firmware (bios-microvm.bin, SeaBIOS; from Debian's seabios 1.16.3 on)
// overwrote the page at ParamsAddr, so parameters given with -device
// loader were lost and the guest ran on its defaults. The slice is new.
func QEMUMachineArgs() []string { return []string{"-M", "microvm", "-bios", "qboot.rom"} }
