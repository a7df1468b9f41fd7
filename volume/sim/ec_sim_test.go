package sim

import (
	"flag"
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"tern/internal/tlsconf/tlstest"
)

var (
	flagECSeeds    = flag.Int("ec.seeds", 0, "TestSimulationEC: run this many seeds from -ec.first (0: the CI budget)")
	flagECFirst    = flag.Int64("ec.first", 0, "TestSimulationEC: the first seed")
	flagECSeed     = flag.Int64("ec.seed", -1, "TestSimulationEC: run only this seed")
	flagECSteps    = flag.Int("ec.steps", 0, "TestSimulationEC: ticks of the faulty phase (0: the default)")
	flagECTrace    = flag.Bool("ec.trace", false, "TestSimulationEC: log every trace line as it happens")
	flagECCrash    = flag.Float64("ec.crash", -1, "TestSimulationEC: the chance of a shard's power cut per tick (default: the campaign's)")
	flagECTakeover = flag.Float64("ec.takeover", -1, "TestSimulationEC: the chance of a takeover per tick (default: the campaign's)")
)

// ciECSeeds is the budget a plain `go test ./volume/sim` runs: each
// layout of DefaultECConfig's cycle twice.
const ciECSeeds = 6

func ecSeeds() []uint64 {
	if *flagECSeed >= 0 {
		return []uint64{uint64(*flagECSeed)}
	}
	n := *flagECSeeds
	if n <= 0 {
		n = ciECSeeds
	}
	out := make([]uint64, n)
	for i := range out {
		out[i] = uint64(*flagECFirst) + uint64(i)
	}
	return out
}

// TestSimulationEC runs the erasure-coded volume's seeds: the production
// volume and downstairs, QUIC and TLS, over the simulated network and
// disks, in virtual time.
func TestSimulationEC(t *testing.T) {
	runECSeeds(t, DefaultProbabilities())
}

// TestSimulationECWholeVolumeCrash adds crashes of every shard at once
// while the upstairs runs: one loses power, the others their processes.
func TestSimulationECWholeVolumeCrash(t *testing.T) {
	runECSeeds(t, WholeVolumeCrashProbabilities())
}

func runECSeeds(t *testing.T, chances Probabilities) {
	certs := tlstest.Loopback(t)
	for _, seed := range ecSeeds() {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			wall := time.Now()
			synctest.Test(t, func(t *testing.T) {
				// The bubble's clock starts in 2000; certificates are
				// checked against the wall clock plus virtual time passed.
				start := time.Now()
				now := func() time.Time { return wall.Add(time.Since(start)) }
				server, client := certs.ServerConfig(), certs.ClientConfig("127.0.0.1")
				server.Time, client.Time = now, now
				cfg := DefaultECConfig(seed, server, client)
				cfg.Faults[faultCrashAll] = chances[faultCrashAll]
				if *flagECCrash >= 0 {
					cfg.Faults[faultCrash] = *flagECCrash
				}
				if *flagECTakeover >= 0 {
					cfg.Faults[faultTakeover] = *flagECTakeover
				}
				if *flagECSteps > 0 {
					cfg.Steps = *flagECSteps
				}
				if *flagECTrace {
					cfg.Logf = t.Logf
					cfg.DumpStacks = true
				}
				res := RunEC(cfg)
				t.Log(res.Summary())
				t.Logf("faults: %s", faultLine(res.Faults))
				if len(res.Violations) == 0 {
					return
				}
				for _, v := range res.Violations {
					t.Errorf("seed %d: %s", seed, v)
				}
				t.Logf("replay the seed's faults with -run '%s' -ec.seed %d; its trace:\n%s",
					t.Name()[:strings.Index(t.Name(), "/")], seed, strings.Join(res.Trace, "\n"))
			})
		})
	}
}

func faultLine(c FaultCounts) string {
	var parts []string
	c.Each(func(kind string, n int) {
		if n > 0 {
			parts = append(parts, fmt.Sprintf("%s=%d", kind, n))
		}
	})
	return strings.Join(parts, " ")
}
