package vmm

import (
	"bytes"
	"encoding/binary"
	"strings"
	"testing"

	"tern/internal/blockio"
	"tern/vmm/acpi"
	"tern/vmm/boot"
	"tern/vmm/kvm"
	"tern/vmm/memory"
)

func TestLinuxCPUIDSetsTheHypervisorBitAndTSCDeadlineOnlyWhenOffered(t *testing.T) {
	base := func() []kvm.CPUIDEntry2 {
		return []kvm.CPUIDEntry2{
			{Function: 0, EAX: 0xd},
			{Function: 1, ECX: 0x1, EDX: 0x200}, // SSE3; APIC
			{Function: 0x40000000, EAX: 0x40000001},
		}
	}
	for _, c := range []struct {
		tscDeadline bool
		wantECX     uint32
	}{
		{false, 0x1 | cpuidHypervisor},
		{true, 0x1 | cpuidHypervisor | cpuidTSCDeadline},
	} {
		got := linuxCPUID(base(), c.tscDeadline)
		want := base()
		want[1].ECX = c.wantECX
		for i := range want {
			if got[i] != want[i] {
				t.Errorf("tscDeadline %v: entry %d = %+v; want %+v", c.tscDeadline, i, got[i], want[i])
			}
		}
	}
}

func TestCPUIDForGivesEachVCPUItsAPICID(t *testing.T) {
	supported := []kvm.CPUIDEntry2{
		{Function: 1, EBX: 0x07_02_08_00, EDX: 0x200}, // host APIC ID 7, 2 logical CPUs, CLFLUSH 8
		{Function: 0xb, Index: 0, EBX: 1, ECX: 0x100, EDX: 5},
		{Function: 0xb, Index: 1, EAX: 1, EBX: 2, ECX: 0x201, EDX: 5},
		{Function: 0x1f, Index: 0, EBX: 1, ECX: 0x100, EDX: 5},
		{Function: 0x80000001, EBX: 0xdead},
	}
	for _, id := range []int{0, 1, 3} {
		got := cpuidFor(supported, id)
		for i, e := range got {
			want := supported[i]
			switch e.Function {
			case 1:
				want.EBX = 0x00_02_08_00 | uint32(id)<<24
			case 0xb, 0x1f:
				want.EDX = uint32(id)
			}
			if e != want {
				t.Errorf("vCPU %d: leaf %#x.%d = %+v, want %+v", id, e.Function, e.Index, e, want)
			}
		}
	}
	if supported[0].EBX != 0x07_02_08_00 || supported[1].EDX != 5 {
		t.Error("cpuidFor changed the supported entries it was given")
	}
}

func TestWriteACPIDescribesTheVCPUsAndTheOccupiedSlots(t *testing.T) {
	mem, err := memory.New(memory.RegionSpec{Name: "ram", Size: 2 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	cfg := Config{VCPUs: 3, Disks: make([]blockio.Device, 2)}
	if err := writeACPI(mem, cfg); err != nil {
		t.Fatal(err)
	}
	want, err := acpi.Build(acpi.RSDPScanStart, acpi.Spec{
		VCPUs:   3,
		Serials: []acpi.Serial{{Port: 0x3f8, GSI: 4}},
		VirtioMMIO: []acpi.VirtioMMIO{
			{Slot: 0, Base: 0xfeb00000, Size: 0x200, GSI: 16},
			{Slot: 1, Base: 0xfeb00200, Size: 0x200, GSI: 17},
		},
		Power: &acpi.Power{SleepControl: 0x600, SleepStatus: 0x601, Reset: 0x602, ResetValue: 1, S5Type: 5},
	})
	if err != nil {
		t.Fatal(err)
	}
	got, err := mem.Slice(acpi.RSDPScanStart, uint64(len(want.Bytes)))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want.Bytes) {
		t.Error("the tables in guest memory are not those of 3 vCPUs, COM1, the power registers and disks in slots 0 and 1")
	}
	// The reset vector writes the reset value to the reset register.
	stub, err := mem.Slice(0xffff0, 16)
	if err != nil {
		t.Fatal(err)
	}
	if want := []byte{0xba, 0x02, 0x06, 0xb0, 0x01, 0xee, 0xf4}; !bytes.HasPrefix(stub, want) {
		t.Errorf("the reset vector holds % x, want % x… (mov dx, 0x602; mov al, 1; out dx, al; hlt)", stub, want)
	}
	zp, err := mem.Slice(boot.ZeroPageAddr, 0x78)
	if err != nil {
		t.Fatal(err)
	}
	if rsdp := binary.LittleEndian.Uint64(zp[0x70:]); rsdp != acpi.RSDPScanStart {
		t.Errorf("boot_params.acpi_rsdp_addr = %#x, want %#x", rsdp, acpi.RSDPScanStart)
	}
}

func TestLinuxGuestWithMoreVCPUsThanTheMADTListsIsAConfigError(t *testing.T) {
	for _, c := range []struct {
		vcpus int
		bad   bool
	}{{1, false}, {acpi.MaxVCPUs, false}, {acpi.MaxVCPUs + 1, true}} {
		cfg := Config{Linux: &LinuxGuest{}, MemoryBytes: 64 << 20, VCPUs: c.vcpus}
		_, errs := cfg.validate()
		found := false
		for _, err := range errs {
			found = found || strings.Contains(err.Error(), "MADT lists at most")
		}
		if found != c.bad {
			t.Errorf("%d vCPUs: validate = %v; want a MADT error: %v", c.vcpus, errs, c.bad)
		}
	}
}
