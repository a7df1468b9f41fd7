package vmm_test

import (
	"errors"
	"strings"
	"testing"

	"tern/vmm"
	"tern/vmm/guests"
	"tern/vmm/kvm"
	"tern/vmm/kvm/kvmtest"
	"tern/vmm/vcpu"
)

// TestTripleFaultEndsRunWithACrashReport makes hello triple-fault on
// purpose (its exception handler loads an empty IDT and faults again at
// CPL0) on a VM with two vCPUs, and checks what Run returns: the vCPU's
// ErrShutdown inside a CrashError whose report holds what a reader needs
// to tell why. The boot vCPU's IDT is the empty one and its last exit the
// shutdown, after the UART writes of its line; the application processor
// (tern's own guests park it at a HLT) did nothing else; the history says
// the VM booted and ran.
func TestTripleFaultEndsRunWithACrashReport(t *testing.T) {
	kvmtest.Require(t)
	vm := newVM(t, vmm.Config{Guest: "hello", VCPUs: 2, Params: &guests.Params{HelloFault: guests.HelloFaultTriple}})
	con := newConsole(t, vm)
	r := wait(t, start(t, vm))
	con.waitLine(guests.HelloLine)
	if !errors.Is(r.err, vcpu.ErrShutdown) {
		t.Fatalf("Run = %#x, %v; want a vCPU's ErrShutdown", r.status, r.err)
	}
	var crash *vmm.CrashError
	if !errors.As(r.err, &crash) {
		t.Fatalf("Run's error %v is no CrashError", r.err)
	}
	rep := crash.Report
	t.Logf("%v", r.err)
	if len(rep.VCPUs) != 2 || len(rep.Missing) > 0 {
		t.Fatalf("report has %d vCPUs (want 2), missing %v", len(rep.VCPUs), rep.Missing)
	}
	boot, ap := rep.VCPUs[0], rep.VCPUs[1]
	switch {
	case boot.ResetByKVM():
		// AMD SVM (the emulated test host): KVM reset the vCPU before it
		// reported the shutdown, and the report says so.
		if !strings.Contains(r.err.Error(), "reset by KVM before it reported the shutdown") {
			t.Errorf("boot vCPU reset by KVM, and the report does not say so:\n%v", r.err)
		}
	case boot.ID != 0 || boot.Sregs.IDT.Limit != 0 || boot.Sregs.IDT.Base != 0:
		t.Errorf("boot vCPU %d: IDT %#x/%#x, want the empty one the handler loaded", boot.ID, boot.Sregs.IDT.Base, boot.Sregs.IDT.Limit)
	case boot.Sregs.EFER&(1<<10) == 0: // EFER.LMA: it faulted in long mode
		t.Errorf("boot vCPU EFER %#x: not in long mode", boot.Sregs.EFER)
	}
	if n := len(boot.Exits); n == 0 || boot.Exits[n-1].Reason != kvm.ExitShutdown {
		t.Errorf("boot vCPU's last exits %v: want the shutdown last", boot.Exits)
	}
	sawUART := false
	for _, x := range boot.Exits {
		sawUART = sawUART || x.Reason == kvm.ExitIO && x.Addr >= 0x3f8 && x.Addr < 0x400
	}
	if !sawUART {
		t.Errorf("boot vCPU's last exits %v: no UART access before the fault", boot.Exits)
	}
	if ap.ID != 1 || len(ap.Exits) > 1 {
		t.Errorf("application processor %d ran: exits %v", ap.ID, ap.Exits)
	}
	var history []string
	for _, h := range rep.History {
		history = append(history, h.What)
	}
	if len(history) < 2 || !strings.HasPrefix(history[0], "booted") || history[len(history)-1] != "running" {
		t.Errorf("history %q: want booted, then running", history)
	}
	text := r.err.Error()
	for _, want := range []string{"KVM_EXIT_SHUTDOWN", "crash report:", "vCPU 0: mp=", "vCPU 1: mp=", "idt=0x0/0x0", "last exits:", "SHUTDOWN"} {
		if !strings.Contains(text, want) {
			t.Errorf("the error's text lacks %q:\n%s", want, text)
		}
	}
}
