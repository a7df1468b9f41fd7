package guests

import (
	"slices"
	"strings"
	"testing"
)

func TestParseSMPPass(t *testing.T) {
	line := "smp: pass 12 aps started cpu0 up 3000 work 81920000 sweeps 40 timer 290 ipi-in 300 ipi-out 299 cpu1 waiting cpu2 up 10 work 7 sweeps 0 timer 1 ipi-in 2 ipi-out 3"
	p, ok := ParseSMPPass(line)
	want := SMPPass{N: 12, APs: "started", CPUs: []SMPCPU{
		{Started: true, UpMs: 3000, Work: 81920000, Sweeps: 40, Timer: 290, IPIsIn: 300, IPIsOut: 299},
		{},
		{Started: true, UpMs: 10, Work: 7, Timer: 1, IPIsIn: 2, IPIsOut: 3},
	}}
	if !ok || p.N != want.N || p.APs != want.APs || len(p.CPUs) != len(want.CPUs) {
		t.Fatalf("ParseSMPPass = %+v, %v; want %+v", p, ok, want)
	}
	for i := range want.CPUs {
		if p.CPUs[i] != want.CPUs[i] {
			t.Errorf("cpu%d = %+v, want %+v", i, p.CPUs[i], want.CPUs[i])
		}
	}
	for _, bad := range []string{
		"smp: pass x aps started",
		"smp: pass 1 aps started cpu1 waiting",                    // CPUs out of order
		"smp: pass 1 aps started cpu0 up 1 work 2 sweeps 3 timer", // cut short
		"smp: pass 1 aps started cpu0 up 1 work 2 sweeps 3 timer 4 ipi-out 5 ipi-in 6",
		"smp: FAIL cpu 1 memory: slot 3 want 4 found 5",
		"dirty: verify PASS generation 1",
	} {
		if p, ok := ParseSMPPass(bad); ok {
			t.Errorf("ParseSMPPass(%q) = %+v, want not ok", bad, p)
		}
	}
	if n, regions, size, ok := ParseSMPStart("smp: cpu0 up, 4 cpus, regions at 0x127000 of 262144 bytes"); !ok || n != 4 || regions != 0x127000 || size != 262144 {
		t.Errorf("ParseSMPStart = %d %#x %d %v", n, regions, size, ok)
	}
}

func TestParseSMPTimers(t *testing.T) {
	if m, ok := ParseSMPTimers("smp: timers periodic tsc-deadline periodic"); !ok || !slices.Equal(m, []string{"periodic", "tsc-deadline", "periodic"}) {
		t.Errorf("ParseSMPTimers = %q, %v", m, ok)
	}
	for _, bad := range []string{"smp: timers ", "smp: timers oneshot", "smp: all 2 cpus started"} {
		if m, ok := ParseSMPTimers(bad); ok {
			t.Errorf("ParseSMPTimers(%q) = %q, want not ok", bad, m)
		}
	}
	if m := SMPWantTimers(4, true); !slices.Equal(m, []string{"periodic", "tsc-deadline", "periodic", "tsc-deadline"}) {
		t.Errorf("SMPWantTimers(4, true) = %q", m)
	}
	if m := SMPWantTimers(2, false); !slices.Equal(m, []string{"periodic", "periodic"}) {
		t.Errorf("SMPWantTimers(2, false) = %q", m)
	}
}

func TestCheckSMPProgress(t *testing.T) {
	cpu := func(up, work, sweeps, timer, in, out uint64) SMPCPU {
		return SMPCPU{Started: true, UpMs: up, Work: work, Sweeps: sweeps, Timer: timer, IPIsIn: in, IPIsOut: out}
	}
	prev := SMPPass{N: 1, CPUs: []SMPCPU{cpu(100, 10, 1, 10, 5, 5), cpu(90, 10, 1, 9, 5, 6), {}}}
	for _, c := range []struct {
		name string
		cur  SMPPass
		want string // "" for nil, else a part of the error
	}{
		{"went on", SMPPass{N: 5, CPUs: []SMPCPU{cpu(200, 20, 2, 20, 8, 9), cpu(190, 20, 2, 19, 9, 9), {}}}, ""},
		{"an AP started since", SMPPass{N: 5, CPUs: []SMPCPU{cpu(200, 20, 2, 20, 8, 9), cpu(190, 20, 2, 19, 9, 9), cpu(5, 1, 0, 0, 0, 0)}}, ""},
		{"work stood still", SMPPass{N: 5, CPUs: []SMPCPU{cpu(200, 20, 2, 20, 8, 9), cpu(190, 10, 2, 19, 9, 9), {}}}, "cpu1 work 10 then 10"},
		{"timer went back", SMPPass{N: 5, CPUs: []SMPCPU{cpu(200, 20, 2, 2, 8, 9), cpu(190, 20, 2, 19, 9, 9), {}}}, "cpu0 timer 10 then 2"},
		{"no IPI taken", SMPPass{N: 5, CPUs: []SMPCPU{cpu(200, 20, 2, 20, 5, 9), cpu(190, 20, 2, 19, 9, 9), {}}}, "cpu0 ipi-in 5 then 5"},
		{"more taken than sent", SMPPass{N: 5, CPUs: []SMPCPU{cpu(200, 20, 2, 20, 9, 8), cpu(190, 20, 2, 19, 9, 9), {}}}, "18 IPIs taken, 17 sent"},
		{"more in flight than pairs", SMPPass{N: 5, CPUs: []SMPCPU{cpu(200, 20, 2, 20, 8, 12), cpu(190, 20, 2, 19, 9, 9), {}}}, "17 IPIs taken, 21 sent"},
		{"a CPU stopped", SMPPass{N: 5, CPUs: []SMPCPU{cpu(200, 20, 2, 20, 8, 9), {}, {}}}, "cpu1 stopped"},
	} {
		err := CheckSMPProgress(prev, c.cur)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: %v", c.name, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: %v, want an error with %q", c.name, err, c.want)
		}
	}
}

func TestCheckSMPTimerRate(t *testing.T) {
	for _, c := range []struct {
		up, timer uint64
		ok        bool
	}{{1000, 100, true}, {1000, 101, true}, {1000, 13, true}, {1000, 102, false}, {1000, 11, false}, {5, 0, true}} {
		err := CheckSMPTimerRate(SMPPass{CPUs: []SMPCPU{{Started: true, UpMs: c.up, Timer: c.timer}, {}}})
		if (err == nil) != c.ok {
			t.Errorf("%d ticks in %d ms: %v, want ok %v", c.timer, c.up, err, c.ok)
		}
	}
}
