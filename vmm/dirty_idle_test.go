package vmm_test

import (
	"testing"

	"tern/vmm"
	"tern/vmm/guests"
	"tern/vmm/kvm"
	"tern/vmm/kvm/kvmtest"
	"tern/vmm/memory"
)

// TestIdleDirtyGuestVerifiesAndDirtiesNoPatternPage runs the dirty guest
// idle under KVM's dirty log: across verifications on request, no page of
// its patterned area is logged, while the parameter page, where it
// acknowledges each request, is (the log does see its writes).
func TestIdleDirtyGuestVerifiesAndDirtiesNoPatternPage(t *testing.T) {
	kvmtest.Require(t)
	const patternStart, patternBytes = 4 << 20, 16 << 20 // the guest's defaults
	// No periodic verification in the test's time: every verify line
	// answers a request, so the order of events below is certain.
	vm := newVM(t, vmm.Config{Guest: "dirty", Params: &guests.Params{
		Passes: guests.PassesForever, Idle: true, VerifyEverySec: 3600}})
	con := newConsole(t, vm)
	start(t, vm)
	con.waitLine("dirty: idle, dirtying nothing") // printed after the fill

	slots, err := vm.SetDirtyLogging(true)
	if err != nil {
		t.Fatal(err)
	}
	ram := slots[0]
	bitmap := make([]uint64, kvm.DirtyBitmapWords(uint64(len(ram.Memory))))
	fetch := func() []uint64 {
		t.Helper()
		if err := vm.KVM().GetDirtyLog(ram, bitmap); err != nil {
			t.Fatal(err)
		}
		return memory.DirtyPages(bitmap)
	}
	request := uint32(0)
	verify := func() {
		t.Helper()
		request++
		if err := vm.Memory().AtomicPutUint32(guests.ParamsAddr+guests.VerifyRequestOffset, request); err != nil {
			t.Fatal(err)
		}
		line := con.waitFor("a verify line", func(l string) bool { _, ok := guests.ParseDirtyVerify(l); return ok })
		if v, _ := guests.ParseDirtyVerify(line); !v.Pass || v.Generation != 0 {
			t.Fatalf("verification %d: %q, want a PASS of generation 0", request, line)
		}
	}
	fetch() // from here on
	for window := range 2 {
		// The guest acknowledges the first request after its PASS line
		// and before it reads the second: inside this window.
		verify()
		verify()
		var pattern []uint64
		paramsPageDirty := false
		for _, p := range fetch() {
			switch {
			case p*memory.PageSize >= patternStart && p*memory.PageSize < patternStart+patternBytes:
				pattern = append(pattern, p)
			case p == guests.ParamsAddr/memory.PageSize:
				paramsPageDirty = true
			}
		}
		if len(pattern) > 0 {
			t.Errorf("window %d: %d pages of the pattern dirty (first %#x), want none", window, len(pattern), pattern[0]*memory.PageSize)
		}
		if !paramsPageDirty {
			t.Errorf("window %d: the parameter page, where the guest acknowledged a request, is not in the dirty log", window)
		}
	}
}
