package migration

import (
	"errors"
	"fmt"
	"math/bits"

	"tern/vmm"
	"tern/vmm/kvm"
	"tern/vmm/memory"
)

// tracker follows the source guest's dirty pages across rounds: KVM's
// dirty log of each slot (manual protect where KVM has it) ORed with the
// VMM's own bitmap of each region, and every page sent in this attempt so
// that a failure can re-mark them.
type tracker struct {
	vm      *vmm.VM
	regions []*memory.Region
	slots   []kvm.MemoryRegion
	manual  bool
	logging bool
	// dirty[i] is region i's pages to send next (KVM's layout).
	dirty [][]uint64
	// sent[i] is region i's pages sent in this attempt.
	sent [][]uint64
	// delivered[i] is region i's pages whose bytes went to the target in
	// this attempt: every other page of the target's fresh memory is zero.
	delivered [][]uint64
}

func newTracker(vm *vmm.VM) *tracker {
	t := &tracker{vm: vm, regions: vm.Memory().Regions()}
	for _, r := range t.regions {
		w := kvm.DirtyBitmapWords(r.Size())
		t.dirty = append(t.dirty, make([]uint64, w))
		t.sent = append(t.sent, make([]uint64, w))
		t.delivered = append(t.delivered, make([]uint64, w))
	}
	return t
}

// start turns dirty logging on; from here every guest write is logged.
// The first round sends every page regardless.
func (t *tracker) start() error {
	err := t.vm.KVM().EnableManualDirtyLogProtect()
	switch {
	case err == nil:
		t.manual = true
	case !errors.Is(err, kvm.ErrNotSupported):
		return fmt.Errorf("starting dirty log: %w", err)
	}
	slots, err := t.vm.SetDirtyLogging(true)
	if err != nil {
		return fmt.Errorf("starting dirty log: %w", err)
	}
	t.slots, t.logging = slots, true
	return nil
}

// markAll makes every page of every region due (the first round).
func (t *tracker) markAll() {
	for i, r := range t.regions {
		pages := r.Size() / memory.PageSize
		for w := range t.dirty[i] {
			t.dirty[i][w] = ^uint64(0)
		}
		if pages%64 != 0 {
			t.dirty[i][len(t.dirty[i])-1] = 1<<(pages%64) - 1
		}
	}
}

// harvest ORs into the due pages what the guest (KVM's log) and the VMM
// (the region's bitmap) dirtied since the last harvest, re-protecting
// those pages first (manual protect) so a write after the harvest is
// logged for the next one. It returns how many pages are due.
func (t *tracker) harvest() (uint64, error) {
	var n uint64
	for i, r := range t.regions {
		log := make([]uint64, len(t.dirty[i]))
		if t.logging {
			if err := t.vm.KVM().GetDirtyLog(t.slots[i], log); err != nil {
				return 0, fmt.Errorf("harvesting dirty pages: %w", err)
			}
			if t.manual && anySet(log) {
				if err := t.vm.KVM().ClearDirtyLog(t.slots[i], 0, log); err != nil {
					return 0, fmt.Errorf("harvesting dirty pages: %w", err)
				}
			}
		}
		for w, v := range r.Dirty().Take() {
			log[w] |= v
		}
		for w, v := range log {
			t.dirty[i][w] |= v
			n += uint64(bits.OnesCount64(t.dirty[i][w]))
		}
	}
	return n, nil
}

func anySet(b []uint64) bool {
	for _, w := range b {
		if w != 0 {
			return true
		}
	}
	return false
}

// stop ends dirty logging. With remark (a failed attempt) it first
// returns every page sent, every page still due and every page the log
// still holds to the regions' bitmaps, so nothing the target was sent
// counts as delivered.
func (t *tracker) stop(remark bool) error {
	var errs []error
	if remark {
		if _, err := t.harvest(); err != nil {
			errs = append(errs, err)
		}
		for i, r := range t.regions {
			for w := range t.dirty[i] {
				t.dirty[i][w] |= t.sent[i][w]
			}
			if err := r.Dirty().MergeKVM(t.dirty[i]); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if t.logging {
		if _, err := t.vm.SetDirtyLogging(false); err != nil {
			errs = append(errs, err)
		}
		t.logging = false
	}
	return errors.Join(errs...)
}
