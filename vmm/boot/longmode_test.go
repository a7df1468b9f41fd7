package boot

import (
	"encoding/binary"
	"testing"

	"tern/vmm/kvm"
	"tern/vmm/memory"
)

func TestBuildPageTablesIdentityMaps4GiBWith2MiBUserPages(t *testing.T) {
	m := newRAM(t, 2<<20)
	cr3, err := BuildPageTables(m)
	if err != nil {
		t.Fatal(err)
	}
	if cr3 != 0x1000 {
		t.Fatalf("CR3 %#x, want 0x1000", cr3)
	}
	cases := []struct {
		what string
		addr uint64
		want uint64
	}{
		{"PML4[0] -> PDPT", 0x1000, 0x2000 | 7},
		{"PML4[1] empty", 0x1008, 0},
		{"PDPT[0] -> PD0", 0x2000, 0x3000 | 7},
		{"PDPT[3] -> PD3", 0x2018, 0x6000 | 7},
		{"PDPT[4] empty", 0x2020, 0},
		{"PD0[0] = 0 MiB", 0x3000, 0x87},
		{"PD0[1] = 2 MiB", 0x3008, 0x200000 | 0x87},
		{"PD1[0] = 1 GiB", 0x4000, 0x40000000 | 0x87},
		{"PD3[0] = 3 GiB (boot timer)", 0x6000, 0xc0000000 | 0x87},
		{"PD3[501] = 0xfea00000 (virtio-mmio)", 0x6000 + 8*501, 0xfea00000 | 0x87},
		{"PD3[511] = last 2 MiB below 4 GiB", 0x6ff8, 0xffe00000 | 0x87},
	}
	for _, c := range cases {
		got, err := m.Uint64(memory.GPA(c.addr))
		if err != nil {
			t.Fatal(err)
		}
		if got != c.want {
			t.Errorf("%s: entry at %#x = %#x, want %#x", c.what, c.addr, got, c.want)
		}
	}
}

func TestLongModeStateIs64BitFlatWithAMatchingGDT(t *testing.T) {
	m := newRAM(t, 2<<20)
	st, err := LongModeState(m, 0x1000aa)
	if err != nil {
		t.Fatal(err)
	}
	code := kvm.Segment{Base: 0, Limit: 0xffffffff, Selector: 0x08, Type: 0xb, Present: 1, S: 1, L: 1, G: 1}
	data := kvm.Segment{Base: 0, Limit: 0xffffffff, Selector: 0x10, Type: 0x3, Present: 1, S: 1, DB: 1, G: 1}
	tss := kvm.Segment{Base: 0, Limit: 0xffffffff, Selector: 0x18, Type: 0xb, Present: 1, G: 1}
	want := CPUState{
		RIP: 0x1000aa, RSP: 0x10000, RFLAGS: 2,
		CR0: 0x80000011, CR3: 0x1000, CR4: 0x20, EFER: 0x500,
		CS: code, DS: data, ES: data, FS: data, GS: data, SS: data, TR: tss,
		LDT: kvm.Segment{Type: 2, Present: 1, Limit: 0xffff},
		GDT: kvm.DTable{Base: 0x500, Limit: 31},
	}
	if st != want {
		t.Errorf("state\n got %+v\nwant %+v", st, want)
	}
	gdt, _ := m.Slice(0x500, 32)
	for i, d := range []uint64{0, 0x00af9b000000ffff, 0x00cf93000000ffff, 0x008f8b000000ffff} {
		if got := binary.LittleEndian.Uint64(gdt[8*i:]); got != d {
			t.Errorf("GDT[%d] = %#016x, want %#016x", i, got, d)
		}
	}
	// Architectural rules a vCPU would otherwise fault on.
	if st.CR0&CR0PG != 0 && (st.CR4&CR4PAE == 0 || st.EFER&EFERLME == 0) {
		t.Error("paging in long mode needs PAE and EFER.LME")
	}
	if st.CS.L == 1 && st.CS.DB == 1 {
		t.Error("CS with L=1 must have D=0")
	}
	if st.RIP >= 1<<47 {
		t.Error("RIP not canonical")
	}
}

func TestLongModeStateNeedsRoomForTables(t *testing.T) {
	m := newRAM(t, 0x4000) // too small for the page directories
	if _, err := LongModeState(m, 0x1000); err == nil {
		t.Error("page tables past the end of RAM were accepted")
	}
}
