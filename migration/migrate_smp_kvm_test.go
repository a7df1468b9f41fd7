package migration

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"tern/vmm"
	"tern/vmm/guests"
	"tern/vmm/kvm"
	"tern/vmm/kvm/kvmtest"
)

// The smp guest's migrations: its CPUs' local APICs (timers, IPIs in
// flight, the APs' MP state) cross with the VM, and the guest itself
// fails on a stall, a lost IPI or a wrong page (vmm/guests/src/smp.c).

// smpPassesAfterHop is how many passes (guests.SMPPassPeriod each) the
// target must print before a hop is judged: the pass printed first after
// the resume may come before the other vCPUs' threads ran there.
const smpPassesAfterHop = 4

// smpSource boots the smp guest on vcpus vCPUs with params and returns it
// with its spec and a watch on its console.
func smpSource(t *testing.T, vcpus int, params *guests.Params) (*runningVM, testSpec, *smpWatch) {
	t.Helper()
	spec := testSpec{Guest: "smp", MemoryBytes: 32 << 20, VCPUs: vcpus}
	cfg := spec.config()
	cfg.Params = params
	vm, err := vmm.New(cfg)
	if err != nil {
		t.Fatalf("vmm.New: %v", err)
	}
	r := startVM(t, vm)
	return r, spec, &smpWatch{c: newConsole(vm.Serial().Output(), 0)}
}

// smpWatch reads the smp guest's console across hops: the UART's history
// crosses with the VM at the same offsets, so the watch reads a stopped
// source's last lines and goes on in the target's history where it left.
type smpWatch struct {
	c *console
	// last is the last pass read.
	last guests.SMPPass
}

// check fails the test on a line that says the guest failed.
func (w *smpWatch) check(t *testing.T, line string) {
	t.Helper()
	if strings.HasPrefix(line, guests.SMPFailPrefix) || strings.HasPrefix(line, guests.ExceptionPrefix) {
		t.Fatalf("smp guest: %s", line)
	}
}

// until reads lines until done accepts one (a pass line updates last
// first), failing on a FAIL line or an exception.
func (w *smpWatch) until(t *testing.T, what string, done func(line string) bool) {
	t.Helper()
	w.c.waitFor(t, what, func(l string) bool {
		w.check(t, l)
		if p, ok := guests.ParseSMPPass(l); ok {
			w.last = p
		}
		return done(l)
	})
}

// pass reads lines until a pass for which done is true and returns it.
func (w *smpWatch) pass(t *testing.T, what string, done func(guests.SMPPass) bool) guests.SMPPass {
	t.Helper()
	w.until(t, what, func(l string) bool {
		p, ok := guests.ParseSMPPass(l)
		return ok && done(p)
	})
	return w.last
}

// hop follows the VM from the stopped source src to dst: it reads the
// source's remaining lines, then reads on in dst's history.
func (w *smpWatch) hop(t *testing.T, src, dst *vmm.VM) {
	t.Helper()
	h := src.Serial().Output()
	_, end := h.Bounds()
	data, _, next, err := h.ReadFrom(w.c.off, int(end-w.c.off))
	if err != nil {
		t.Fatalf("reading the source's last output: %v", err)
	}
	w.c.part += string(data)
	w.c.off = next
	for {
		i := strings.IndexByte(w.c.part, '\n')
		if i < 0 {
			break
		}
		line := strings.TrimRight(w.c.part[:i], "\r")
		w.c.part = w.c.part[i+1:]
		w.check(t, line)
		if p, ok := guests.ParseSMPPass(line); ok {
			w.last = p
		}
	}
	w.c.h = dst.Serial().Output()
}

// smpHop migrates src once, over QUIC or same-host (handing the memfds
// over), and returns the target, running; src is stopped and closed.
func smpHop(t *testing.T, src *vmm.VM, spec testSpec, sameHost bool) (*vmm.VM, *migration) {
	t.Helper()
	m := &migration{src: SourceConfig{VM: src, Spec: mustJSON(t, spec)}}
	if sameHost {
		m.src.SameHostSocket = filepath.Join(t.TempDir(), "m.sock")
	}
	m.run(t)
	if m.err != nil || m.dstErr != nil {
		t.Fatalf("Send: %v; Receive: %v", m.err, m.dstErr)
	}
	if sameHost && (m.res.BytesSent != 0 || m.dstRes.BytesSent != 0) {
		t.Fatalf("same-host hop sent %d bytes of pages, received %d; want none", m.res.BytesSent, m.dstRes.BytesSent)
	}
	return m.dstVM, m
}

// afterHop waits for the target's pass smpPassesAfterHop after the last
// one the source printed and checks every CPU went on from there.
func (w *smpWatch) afterHop(t *testing.T, hop int) guests.SMPPass {
	t.Helper()
	before := w.last
	p := w.pass(t, fmt.Sprintf("pass %d (after hop %d)", before.N+smpPassesAfterHop, hop),
		func(p guests.SMPPass) bool { return p.N >= before.N+smpPassesAfterHop })
	if err := guests.CheckSMPProgress(before, p); err != nil {
		t.Fatalf("hop %d: %v", hop, err)
	}
	if err := guests.CheckSMPTimerRate(p); err != nil {
		t.Fatalf("hop %d: %v", hop, err)
	}
	return p
}

// stopWith stops the source the hop left behind and closes it.
func stopWith(t *testing.T, vm *vmm.VM, run func() error) {
	t.Helper()
	if err := run(); !errors.Is(err, vmm.ErrStopped) {
		t.Fatalf("the source's Run = %v, want ErrStopped", err)
	}
	if err := vm.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestSMPGuestSurvivesTwentyMigrationsWithEveryCPUCounting migrates the
// smp guest on four vCPUs 20 times in a row, alternating QUIC and
// same-host, while every CPU works, checks its memory, takes its LAPIC
// timer and sends and takes IPIs. After each hop every CPU's counters
// went on from the source's last pass; at the end the guest has run
// longer than its own stall limit since the last hop, so an IPI or a
// timer lost on any hop would have failed it.
func TestSMPGuestSurvivesTwentyMigrationsWithEveryCPUCounting(t *testing.T) {
	kvmtest.Require(t)
	const cpus = 4
	// Inside the emulated host a QUIC hop costs seconds (pages cross at
	// well under 1 MiB/s there): fewer hops prove the same path.
	hops := kvmtest.Sized(20, 4)
	src, spec, w := smpSource(t, cpus, nil)
	w.until(t, "all CPUs started", func(l string) bool { return l == guests.SMPAllStarted(cpus) })
	// Both timer modes cross: the odd CPUs' re-armed TSC deadlines
	// (IA32_TSC_DEADLINE, restored after the LAPIC), the others' TMICT.
	var modes []string
	w.until(t, "the timers line", func(l string) bool {
		var ok bool
		modes, ok = guests.ParseSMPTimers(l)
		return ok
	})
	has, err := src.vm.KVM().CheckExtension(kvm.CapTSCDeadlineTimer)
	if err != nil {
		t.Fatal(err)
	}
	if want := guests.SMPWantTimers(cpus, has > 0); !slices.Equal(modes, want) {
		t.Fatalf("timers %q, want %q (KVM_CAP_TSC_DEADLINE_TIMER %d)", modes, want, has)
	}
	w.pass(t, "a pass with every CPU started", func(p guests.SMPPass) bool { return p.APs == "started" })
	vm, run := src.vm, func() error { return src.wait(t) }
	start := time.Now()
	var hopTimes []time.Duration
	for hop := 1; hop <= hops; hop++ {
		sameHost := hop%2 == 0
		hopStart := time.Now()
		dst, m := smpHop(t, vm, spec, sameHost)
		hopTimes = append(hopTimes, time.Since(hopStart))
		w.hop(t, vm, dst)
		stopWith(t, vm, run)
		p := w.afterHop(t, hop)
		kind := "QUIC"
		if sameHost {
			kind = "same-host"
		}
		t.Logf("hop %d (%s): %v (downtime %v, %d rounds, %d KiB sent); pass %d: %+v",
			hop, kind, hopTimes[hop-1].Round(time.Millisecond), m.res.Downtime, m.res.Rounds, m.res.BytesSent>>10, p.N, p.CPUs)
		r := m.dstRun
		vm, run = dst, func() error { return r.wait(t) }
	}
	migrating := time.Since(start)
	last := w.last
	final := w.pass(t, "the passes past the guest's stall limit", func(p guests.SMPPass) bool { return p.N > last.N+guests.SMPStallPasses })
	if err := guests.CheckSMPProgress(last, final); err != nil {
		t.Fatal(err)
	}
	if err := guests.CheckSMPTimerRate(final); err != nil {
		t.Fatal(err)
	}
	var hopSum time.Duration
	for _, d := range hopTimes {
		hopSum += d
	}
	t.Logf("%d hops in %v (migrations alone %v, %v a hop on average); final pass %d: %+v",
		hops, migrating.Round(time.Millisecond), hopSum.Round(time.Millisecond), (hopSum / time.Duration(hops)).Round(time.Millisecond), final.N, final.CPUs)
}

// TestSMPGuestMigratedWhileItsAPsWaitStartsThemOnTheTarget migrates the
// smp guest while its BSP holds the APs' start, before the INIT (the APs
// in KVM's reset state, KVM_MP_STATE_UNINITIALIZED) and between the INIT
// and the start-up IPIs (KVM_MP_STATE_INIT_RECEIVED), over QUIC and then
// same-host; on the final target the APs are still waiting, and start
// and run when the BSP goes on.
func TestSMPGuestMigratedWhileItsAPsWaitStartsThemOnTheTarget(t *testing.T) {
	kvmtest.Require(t)
	const cpus = 3
	for _, c := range []struct {
		name  string
		hold  uint64
		aps   string
		state kvm.MPState
	}{
		{"before-INIT", guests.SMPHoldBeforeINIT, "held", kvm.MPStateUninitialized},
		{"before-SIPI", guests.SMPHoldBeforeSIPI, "init-sent", kvm.MPStateInitReceived},
	} {
		t.Run(c.name, func(t *testing.T) {
			src, spec, w := smpSource(t, cpus, &guests.Params{APHold: c.hold})
			w.pass(t, "a pass with the APs "+c.aps, func(p guests.SMPPass) bool { return p.APs == c.aps })
			vm, run := src.vm, func() error { return src.wait(t) }
			for hop, sameHost := range []bool{false, true} {
				dst, m := smpHop(t, vm, spec, sameHost)
				w.hop(t, vm, dst)
				stopWith(t, vm, run)
				w.afterHop(t, hop+1)
				r := m.dstRun
				vm, run = dst, func() error { return r.wait(t) }
			}
			if w.last.APs != c.aps {
				t.Fatalf("after the hops the APs are %q, want %q", w.last.APs, c.aps)
			}
			checkAPsMPState(t, vm, c.state)
			// Release the hold: the BSP sends what it held back.
			if err := vm.Memory().PutUint64(guests.ParamsAddr+guests.APGoOffset, 1); err != nil {
				t.Fatal(err)
			}
			w.until(t, "all CPUs started", func(l string) bool { return l == guests.SMPAllStarted(cpus) })
			first := w.pass(t, "a pass with every CPU started", func(p guests.SMPPass) bool { return p.APs == "started" })
			p := w.pass(t, "a later pass", func(p guests.SMPPass) bool { return p.N >= first.N+smpPassesAfterHop })
			if err := guests.CheckSMPProgress(first, p); err != nil {
				t.Fatal(err)
			}
			checkAPsMPState(t, vm, kvm.MPStateRunnable)
		})
	}
}

// checkAPsMPState pauses vm, checks every AP's MP state is want, and
// resumes it.
func checkAPsMPState(t *testing.T, vm *vmm.VM, want kvm.MPState) {
	t.Helper()
	if err := vm.Pause(); err != nil {
		t.Fatal(err)
	}
	for _, c := range vm.KVMVCPUs()[1:] {
		if mp, err := c.MPState(); err != nil || mp != want {
			t.Errorf("vCPU %d: MP state %v (%v), want %v", c.ID(), mp, err, want)
		}
	}
	if err := vm.Resume(); err != nil {
		t.Fatal(err)
	}
}
