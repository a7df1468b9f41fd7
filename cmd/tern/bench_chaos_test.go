package main

import (
	"strings"
	"testing"
)

// TestBenchSoakRunsTheLoopAndReportsEveryFigure runs a few seconds of
// `tern bench soak`: it must finish cleanly and print each sampled figure.
func TestBenchSoakRunsTheLoopAndReportsEveryFigure(t *testing.T) {
	stdout, stderr, code := runTern(t, "bench", "soak", "--duration", "4s")
	if code != 0 {
		t.Fatalf("bench soak exited %d: %s\n%s", code, stderr, stdout)
	}
	for _, want := range []string{"0 violations, 0 lost", "goroutines", "udp_sockets", "rss_mib", "downstairs_fds"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("report lacks %q:\n%s", want, stdout)
		}
	}
}

// TestBenchCrashRunsACampaign runs a two-round crash campaign.
func TestBenchCrashRunsACampaign(t *testing.T) {
	stdout, stderr, code := runTern(t, "bench", "crash", "--rounds", "2", "--seed", "3")
	if code != 0 {
		t.Fatalf("bench crash exited %d: %s\n%s", code, stderr, stdout)
	}
	if !strings.Contains(stdout, "2 rounds") || !strings.Contains(stdout, "0 violations, 0 lost") {
		t.Errorf("report: %s", stdout)
	}
}
