package vmm

import (
	"testing"

	"tern/vmm/kvm"
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
