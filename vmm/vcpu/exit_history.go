package vcpu

import (
	"fmt"

	"tern/vmm/kvm"
)

// exitHistoryLen is how many of its last exits a vCPU keeps for a crash
// report.
const exitHistoryLen = 8

// Exit is one exit from KVM_RUN as a crash report shows it: the reason,
// and the port or address of an IO or MMIO exit.
type Exit struct {
	Reason kvm.ExitReason
	// Write is an OUT or an MMIO write; Addr the port or MMIO address.
	Write bool
	Addr  uint64
}

// String is "IO out 0x3f8", "MMIO read 0xd0000000" or the reason.
func (e Exit) String() string {
	dir := "read"
	if e.Write {
		dir = "write"
	}
	switch e.Reason {
	case kvm.ExitIO:
		if e.Write {
			dir = "out"
		} else {
			dir = "in"
		}
		return fmt.Sprintf("IO %s %#x", dir, e.Addr)
	case kvm.ExitMMIO:
		return fmt.Sprintf("MMIO %s %#x", dir, e.Addr)
	}
	return e.Reason.String()
}

// exitHistory is a ring of the last exits; only the vCPU goroutine
// writes it.
type exitHistory struct {
	ring [exitHistoryLen]Exit
	n    uint64 // exits recorded in all
}

func (h *exitHistory) record(e Exit) {
	h.ring[h.n%exitHistoryLen] = e
	h.n++
}

// last returns the kept exits, oldest first.
func (h *exitHistory) last() []Exit {
	k := min(h.n, exitHistoryLen)
	out := make([]Exit, 0, k)
	for i := h.n - k; i < h.n; i++ {
		out = append(out, h.ring[i%exitHistoryLen])
	}
	return out
}

// LastExits returns the vCPU's last exits from KVM_RUN, oldest first, the
// one that ended it last. Call it only once Wait has returned: the vCPU
// goroutine writes the history while it runs.
func (v *VCPU) LastExits() []Exit {
	<-v.done
	return v.exits.last()
}
