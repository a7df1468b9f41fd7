package guests

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// The smp guest's lines besides its passes (ParseSMPPass).
const (
	// SMPFailPrefix starts the line the smp guest prints before it exits
	// with status 1 (a CPU's memory wrong, a stall, a lost or extra IPI,
	// an AP that did not start).
	SMPFailPrefix = "smp: FAIL "
	// SMPINITSent and SMPSIPISent are printed when the BSP sent the
	// application processors INIT and their first start-up IPI.
	SMPINITSent = "smp: INIT sent"
	SMPSIPISent = "smp: SIPI sent"
)

// The smp guest's timings (src/smp.c).
const (
	// SMPTimerPeriod is its local APIC timer's period (TIMER_MS).
	SMPTimerPeriod = 10 * time.Millisecond
	// SMPPassPeriod is the guest time between its passes (PASS_MS).
	SMPPassPeriod = 250 * time.Millisecond
	// SMPStallPasses is how many passes a started CPU's work or timer
	// count may stand still, or an IPI stay in flight, before the guest
	// fails (STALL_PASSES).
	SMPStallPasses = 20
)

// SMPAllStarted is the line the smp guest prints once all n CPUs run.
func SMPAllStarted(n int) string { return fmt.Sprintf("smp: all %d cpus started", n) }

// SMPPass is one of the smp guest's pass lines:
//
//	smp: pass 12 aps started cpu0 up 2000 work 81920000 sweeps 40 timer 200 ipi-in 300 ipi-out 300 cpu1 waiting ...
type SMPPass struct {
	// N is the pass's number, from 1.
	N uint64
	// APs is where the application processors' start is: held,
	// init-sent, starting or started.
	APs string
	// CPUs are the CPUs in order, CPU 0 the BSP.
	CPUs []SMPCPU
}

// SMPCPU is one CPU's counters in a pass line.
type SMPCPU struct {
	// Started is false for an application processor not started yet
	// ("cpuN waiting"), whose counters are then zero.
	Started bool
	// UpMs is the milliseconds since it started, by the guest's TSC
	// (which moves on with the host's clock across a migration).
	UpMs uint64
	// Work is the steps it wrote into its memory region; Sweeps the
	// times it verified the whole region.
	Work, Sweeps uint64
	// Timer is the local APIC timer interrupts it took.
	Timer uint64
	// IPIsIn is the IPIs it took from the others, IPIsOut those it sent
	// them (the guest reads every IPIsIn before any IPIsOut).
	IPIsIn, IPIsOut uint64
}

// ParseSMPPass parses a pass line; ok is false for any other line.
func ParseSMPPass(line string) (p SMPPass, ok bool) {
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "smp:" || f[1] != "pass" || f[3] != "aps" {
		return SMPPass{}, false
	}
	n, err := strconv.ParseUint(f[2], 10, 64)
	if err != nil {
		return SMPPass{}, false
	}
	p = SMPPass{N: n, APs: f[4]}
	for f = f[5:]; len(f) > 0; {
		if f[0] != fmt.Sprintf("cpu%d", len(p.CPUs)) || len(f) < 2 {
			return SMPPass{}, false
		}
		if f[1] == "waiting" {
			p.CPUs = append(p.CPUs, SMPCPU{})
			f = f[2:]
			continue
		}
		if len(f) < 13 {
			return SMPPass{}, false
		}
		c := SMPCPU{Started: true}
		for i, field := range []struct {
			name string
			v    *uint64
		}{{"up", &c.UpMs}, {"work", &c.Work}, {"sweeps", &c.Sweeps}, {"timer", &c.Timer}, {"ipi-in", &c.IPIsIn}, {"ipi-out", &c.IPIsOut}} {
			if f[1+2*i] != field.name {
				return SMPPass{}, false
			}
			if *field.v, err = strconv.ParseUint(f[2+2*i], 10, 64); err != nil {
				return SMPPass{}, false
			}
		}
		p.CPUs = append(p.CPUs, c)
		f = f[13:]
	}
	return p, true
}

// CheckSMPProgress returns an error naming each CPU started in both
// passes whose work, verified sweeps, timer interrupts or IPIs taken did
// not grow from prev to cur, or that stopped or went back; and, for cur,
// IPIs taken and sent that disagree by more than those in flight (at most
// one per ordered pair of started CPUs, the guest's own limit). nil means
// every CPU kept going.
func CheckSMPProgress(prev, cur SMPPass) error {
	if len(prev.CPUs) != len(cur.CPUs) {
		return fmt.Errorf("%d CPUs, then %d", len(prev.CPUs), len(cur.CPUs))
	}
	var errs []string
	started := 0
	for _, c := range cur.CPUs {
		if c.Started {
			started++
		}
	}
	var in, out uint64
	for i, c := range cur.CPUs {
		p := prev.CPUs[i]
		if !c.Started {
			if p.Started {
				errs = append(errs, fmt.Sprintf("cpu%d stopped", i))
			}
			continue
		}
		in, out = in+c.IPIsIn, out+c.IPIsOut
		if !p.Started {
			continue
		}
		for _, v := range []struct {
			what     string
			was, is  uint64
			mustGrow bool
		}{
			{"work", p.Work, c.Work, true},
			{"sweeps", p.Sweeps, c.Sweeps, true},
			{"timer", p.Timer, c.Timer, true},
			// With no other CPU started there is no IPI to take.
			{"ipi-in", p.IPIsIn, c.IPIsIn, started > 1},
			{"ipi-out", p.IPIsOut, c.IPIsOut, false},
		} {
			if v.is < v.was || v.mustGrow && v.is == v.was {
				errs = append(errs, fmt.Sprintf("cpu%d %s %d then %d", i, v.what, v.was, v.is))
			}
		}
	}
	if inFlight := uint64(started * (started - 1)); in > out || out-in > inFlight {
		errs = append(errs, fmt.Sprintf("%d IPIs taken, %d sent, with at most %d in flight", in, out, inFlight))
	}
	if len(errs) > 0 {
		return fmt.Errorf("smp pass %d after %d: %s", cur.N, prev.N, strings.Join(errs, "; "))
	}
	return nil
}

// ParseSMPStart parses the smp guest's first line, "smp: cpu0 up, N cpus,
// regions at ADDR of SIZE bytes": CPU k's memory region is the size bytes
// at addr + k*size. ok is false for any other line.
func ParseSMPStart(line string) (cpus int, regions, size uint64, ok bool) {
	if _, err := fmt.Sscanf(line, "smp: cpu0 up, %d cpus, regions at 0x%x of %d bytes", &cpus, &regions, &size); err != nil {
		return 0, 0, 0, false
	}
	return cpus, regions, size, true
}

// CheckSMPTimerRate returns an error naming each started CPU of p whose
// timer interrupts do not fit its timer's period over its UpMs: at most
// one more than the periods (a periodic timer's first fires one period
// after the start, a TSC-deadline timer's first is the guest's own
// self-IPI; more means a period restored shorter, a divider lost) and at
// least an eighth of them. Only that loose: a periodic timer's ticks
// coalesce while its vCPU does not run (four busy vCPUs on two host
// cores with other work run at a half or less of the time: 0.4 to 0.8 of
// the periods were seen under load), a TSC deadline re-armed late comes
// late, and a migration's downtime adds to both. A lost one-shot deadline
// stops its CPU's count for good, which the guest fails on itself. nil
// means every timer kept its rate.
func CheckSMPTimerRate(p SMPPass) error {
	var errs []string
	for i, c := range p.CPUs {
		periods := c.UpMs / uint64(SMPTimerPeriod/time.Millisecond)
		if c.Started && (c.Timer > periods+1 || c.Timer < periods/8) {
			errs = append(errs, fmt.Sprintf("cpu%d took %d timer interrupts in %d ms, %d periods", i, c.Timer, c.UpMs, periods))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("smp pass %d: %s", p.N, strings.Join(errs, "; "))
	}
	return nil
}

// The smp guest's local APIC timer modes (ParseSMPTimers).
const (
	SMPTimerPeriodic    = "periodic"
	SMPTimerTSCDeadline = "tsc-deadline"
)

// ParseSMPTimers parses "smp: timers MODE...", the line the smp guest
// prints after SMPAllStarted: each CPU's timer mode in order,
// SMPTimerPeriodic or SMPTimerTSCDeadline. ok is false for any other line.
func ParseSMPTimers(line string) (modes []string, ok bool) {
	rest, found := strings.CutPrefix(line, "smp: timers ")
	if !found {
		return nil, false
	}
	modes = strings.Fields(rest)
	for _, m := range modes {
		if m != SMPTimerPeriodic && m != SMPTimerTSCDeadline {
			return nil, false
		}
	}
	return modes, len(modes) > 0
}

// SMPWantTimers returns the timer modes the smp guest uses on cpus CPUs:
// TSC-deadline on the odd ones when the local APICs have it
// (tscDeadline: KVM_CAP_TSC_DEADLINE_TIMER, which tern then puts in the
// guest's CPUID), periodic on the others.
func SMPWantTimers(cpus int, tscDeadline bool) []string {
	modes := make([]string, cpus)
	for i := range modes {
		modes[i] = SMPTimerPeriodic
		if i%2 == 1 && tscDeadline {
			modes[i] = SMPTimerTSCDeadline
		}
	}
	return modes
}
