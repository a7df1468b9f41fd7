package kvm_test

import (
	"errors"
	"math/bits"
	"slices"
	"testing"

	"tern/vmm/kvm"
	"tern/vmm/memory"
)

// The dirty-log guests run in real mode from a code slot that is not
// logged and write only to a separate, logged data slot, so the pages KVM
// reports are exactly the pages the guest wrote: no stack, no page tables,
// no code in the logged slot.
const (
	dirtyCodeAddr = 0x1000  // in slot 0, pages 0-1
	dirtyDataAddr = 0x10000 // slot 1; real-mode DS = dirtyDataAddr >> 4
	dirtyPages    = 16      // one real-mode segment: 64 KiB
	roundDonePort = 0xf4
)

// dirtyGuest returns real-mode code that writes one byte to each page of
// each round in turn (at an offset that varies by page, to show that the
// page, not the address, is logged), OUTs to roundDonePort after each
// round, and halts.
func dirtyGuest(rounds [][]int) []byte {
	code := []byte{
		0xb8, dirtyDataAddr >> 4 & 0xff, dirtyDataAddr >> 12, // mov ax, dirtyDataAddr>>4
		0x8e, 0xd8, // mov ds, ax
		0xb0, 0xaa, // mov al, 0xaa
	}
	for _, pages := range rounds {
		for _, p := range pages {
			off := uint16(p*memory.PageSize + p*8)
			code = append(code, 0xa2, byte(off), byte(off>>8)) // mov [off], al
		}
		code = append(code, 0xe6, roundDonePort) // out roundDonePort, al
	}
	return append(code, 0xf4) // hlt
}

// dirtyRounds are the pages each round writes: round two rewrites a page
// of round one, to show a cleared page is logged again.
var dirtyRounds = [][]int{{1, 3, 7, 15}, {2, 7}}

// newDirtyVM sets up code and a logged data slot and a vCPU at the code;
// setup runs on the VM first.
func newDirtyVM(t *testing.T, setup func(*kvm.VM) error) (*testVM, kvm.MemoryRegion, *kvm.VCPU) {
	t.Helper()
	v := newTestVM(t, setup,
		memory.RegionSpec{Name: "code", Base: 0, Size: 2 * memory.PageSize},
		memory.RegionSpec{Name: "data", Base: dirtyDataAddr, Size: dirtyPages * memory.PageSize})
	if err := v.mem.Write(dirtyCodeAddr, dirtyGuest(dirtyRounds)); err != nil {
		t.Fatal(err)
	}
	v.addSlot(t, 0, 0, 0)
	data := v.addSlot(t, 1, 1, kvm.MemLogDirtyPages)
	lockThread(t)
	cpu, err := v.vm.CreateVCPU(0)
	if err != nil {
		t.Fatal(err)
	}
	if err := kvm.StartRealMode(cpu, dirtyCodeAddr); err != nil {
		t.Fatal(err)
	}
	return v, data, cpu
}

// bitmapPages lists the pages set in a dirty bitmap.
func bitmapPages(bitmap []uint64) []int {
	var pages []int
	for w, word := range bitmap {
		for word != 0 {
			b := bits.TrailingZeros64(word)
			pages = append(pages, w*64+b)
			word &^= 1 << b
		}
	}
	return pages
}

func runRound(t *testing.T, cpu *kvm.VCPU) {
	t.Helper()
	if out := runToOut(t, cpu); out.port != roundDonePort {
		t.Fatalf("OUT to %#x, want the round's end at %#x", out.port, roundDonePort)
	}
}

func TestDirtyLogReportsExactlyThePagesWritten(t *testing.T) {
	v, data, cpu := newDirtyVM(t, nil)
	bitmap := make([]uint64, kvm.DirtyBitmapWords(dirtyPages*memory.PageSize))
	for i, want := range dirtyRounds {
		runRound(t, cpu)
		if err := v.vm.GetDirtyLog(data, bitmap); err != nil {
			t.Fatal(err)
		}
		if got := bitmapPages(bitmap); !slices.Equal(got, sortedPages(want)) {
			t.Errorf("round %d: dirty pages %v, want %v", i, got, sortedPages(want))
		}
	}
	runToHLT(t, cpu)
	// KVM cleared the log with each fetch: nothing is dirty now.
	if err := v.vm.GetDirtyLog(data, bitmap); err != nil {
		t.Fatal(err)
	}
	if got := bitmapPages(bitmap); len(got) != 0 {
		t.Errorf("after the last fetch: dirty pages %v, want none", got)
	}
}

func TestDirtyLogWithManualProtectKeepsPagesUntilCleared(t *testing.T) {
	v, data, cpu := newDirtyVM(t, (*kvm.VM).EnableManualDirtyLogProtect)
	bitmap := make([]uint64, kvm.DirtyBitmapWords(dirtyPages*memory.PageSize))
	runRound(t, cpu)
	for fetch := range 2 {
		if err := v.vm.GetDirtyLog(data, bitmap); err != nil {
			t.Fatal(err)
		}
		if got, want := bitmapPages(bitmap), sortedPages(dirtyRounds[0]); !slices.Equal(got, want) {
			t.Fatalf("fetch %d of round 0: dirty pages %v, want %v (kept until cleared)", fetch, got, want)
		}
	}
	if err := v.vm.ClearDirtyLog(data, 0, bitmap); err != nil {
		t.Fatal(err)
	}
	runRound(t, cpu)
	if err := v.vm.GetDirtyLog(data, bitmap); err != nil {
		t.Fatal(err)
	}
	if got, want := bitmapPages(bitmap), sortedPages(dirtyRounds[1]); !slices.Equal(got, want) {
		t.Fatalf("round 1 after clearing: dirty pages %v, want only the new writes %v", got, want)
	}
}

func TestDirtyLogNeedsALoggedSlot(t *testing.T) {
	v, _, _ := newDirtyVM(t, nil)
	code := v.slots[0]
	if err := v.vm.GetDirtyLog(code, make([]uint64, 1)); err == nil {
		t.Fatal("GetDirtyLog of a slot without MemLogDirtyPages succeeded")
	}
}

func TestDirtyRingReportsExactlyThePagesWritten(t *testing.T) {
	var spec kvm.DirtyRingSpec
	v, data, cpu := newDirtyVM(t, func(vm *kvm.VM) (err error) {
		spec, err = vm.EnableDirtyRing(256)
		return err
	})
	t.Logf("dirty ring: %+v", spec)
	ring, err := cpu.MapDirtyRing(spec)
	if err != nil {
		t.Fatal(err)
	}
	defer ring.Close()
	for i, want := range dirtyRounds {
		runRound(t, cpu)
		var got []int
		n := ring.Harvest(func(p kvm.DirtyPage) {
			if p.Slot != uint16(data.Slot) || p.AddressSpace != 0 {
				t.Errorf("round %d: dirty page %+v outside the data slot %d", i, p, data.Slot)
			}
			got = append(got, int(p.Page))
		})
		slices.Sort(got)
		if !slices.Equal(got, sortedPages(want)) || n != len(got) {
			t.Errorf("round %d: harvested %d, pages %v, want %v", i, n, got, sortedPages(want))
		}
		reset, err := v.vm.ResetDirtyRings()
		if err != nil {
			t.Fatal(err)
		}
		if reset != n {
			t.Errorf("round %d: ResetDirtyRings reset %d entries, want %d", i, reset, n)
		}
	}
	if n := ring.Harvest(func(p kvm.DirtyPage) { t.Errorf("harvested %+v after the last round", p) }); n != 0 {
		t.Errorf("harvested %d entries after the last round", n)
	}
	// A VM with a dirty ring has no bitmap log.
	if err := v.vm.GetDirtyLog(data, make([]uint64, 1)); err == nil {
		t.Error("GetDirtyLog on a VM with a dirty ring succeeded")
	}
}

func TestDirtyRingMustPrecedeVCPUs(t *testing.T) {
	v, _, _ := newDirtyVM(t, nil)
	_, err := v.vm.EnableDirtyRing(256)
	if errors.Is(err, kvm.ErrNotSupported) {
		t.Skip(err)
	}
	if err == nil {
		t.Fatal("EnableDirtyRing after CreateVCPU succeeded")
	}
}

func sortedPages(p []int) []int {
	return slices.Sorted(slices.Values(p))
}
