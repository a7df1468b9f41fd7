package ec

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"testing"

	"tern/volume/downstairs"
	"tern/volume/ids"
)

var (
	campaignSeeds  = flag.Int("ec.seeds", 3, "TestSeededFaultCampaign: seeds 0..N-1")
	campaignSeed   = flag.Int("ec.seed", -1, "TestSeededFaultCampaign: this seed only")
	campaignRounds = flag.Int("ec.rounds", 20, "TestSeededFaultCampaign: rounds per seed")
)

// campaignLayouts are the layouts a seed picks from (seed mod 3): the
// default, the smallest and the one with most parity.
var campaignLayouts = []Layout{DefaultLayout, {Data: 2, Parity: 1}, {Data: 3, Parity: 3}}

// TestSeededFaultCampaignLosesNothingAcknowledged drives the real volume
// against k+m real downstairs (QUIC, mutual TLS) through seeded rounds
// of faults and IO, within the fault model the volume promises to
// survive: at most m shards failed at once, where a failed shard is one
// stopped or one holding a flipped bit nobody has read or scrubbed yet.
// A round injects one fault (stop a shard, bring one back, flip a bit
// at rest in a written block of a shard, replace a shard by an empty
// region, or a takeover: close and activate at the next generation with
// the stopped shards still gone),
// then writes (full and partial stripes), reads and flushes at random.
// Invariants, after every IO: every write and flush is acknowledged
// (never more than m shards are failed), and every read returns exactly
// what the acknowledged writes left. At the end every shard returns,
// repair finishes, a scrub rewrites at most the flipped blocks no read
// found and a second finds nothing, and with any m shards then stopped
// the whole volume still reads back: the redundancy is whole again.
//
// A failing seed replays its choices (not the goroutines' timing) with
// -ec.seed S; -ec.seeds N and -ec.rounds R run a longer campaign.
func TestSeededFaultCampaignLosesNothingAcknowledged(t *testing.T) {
	seeds := make([]int, 0, *campaignSeeds)
	if *campaignSeed >= 0 {
		seeds = append(seeds, *campaignSeed)
	} else {
		for s := range *campaignSeeds {
			seeds = append(seeds, s)
		}
	}
	for _, seed := range seeds {
		l := campaignLayouts[seed%len(campaignLayouts)]
		t.Run(fmt.Sprintf("seed=%d/%s", seed, l), func(t *testing.T) {
			runCampaign(t, uint64(seed), l, *campaignRounds)
		})
	}
}

// campaign is one seed's state: the volume, what it must hold, and which
// shards are failed.
type campaign struct {
	t       *testing.T
	c       *testCluster
	r       *rand.Rand
	v       *Volume
	gen     ids.Generation
	want    []byte
	written []bool // per client block: written at least once
	down    []int  // stopped shards
	flipped []int  // running shards with a flipped block not yet read or scrubbed
	writes  int    // writes issued, each one's data distinct
	log     []string
	// faults counts the faults injected, by kind, for the summary line.
	faults map[string]int
}

func runCampaign(t *testing.T, seed uint64, l Layout, rounds int) {
	c := newTestCluster(t, l)
	cp := &campaign{t: t, c: c, r: rand.New(rand.NewPCG(seed, 0xec)), gen: 1, faults: map[string]int{}}
	cp.v = c.open(cp.gen)
	size := int(cp.v.SizeBytes())
	cp.want = make([]byte, size)
	cp.written = make([]bool, size/testBlockSize)
	defer func() {
		if t.Failed() {
			t.Logf("seed %d's rounds:\n%s", seed, joinLines(cp.log))
		}
	}()
	for round := range rounds {
		cp.fault(round)
		for range 1 + cp.r.IntN(6) {
			cp.io()
		}
		if t.Failed() {
			return
		}
	}
	cp.heal()
	t.Logf("seed %d, %s: %d rounds, %d writes; faults: %d stops, %d restarts, %d bit flips, %d replacements, %d takeovers",
		seed, l, rounds, cp.writes, cp.faults["stop"], cp.faults["start"], cp.faults["flip"], cp.faults["replace"], cp.faults["takeover"])
}

func joinLines(s []string) string {
	out := ""
	for _, l := range s {
		out += "  " + l + "\n"
	}
	return out
}

func (cp *campaign) logf(format string, args ...any) {
	cp.log = append(cp.log, fmt.Sprintf(format, args...))
}

// failed is how many shards count as failed now.
func (cp *campaign) failed() int { return len(cp.down) + len(cp.flipped) }

// healthy returns a random shard that is neither stopped nor flipped.
func (cp *campaign) healthy() int {
	var ok []int
	for i := range cp.c.layout.Shards() {
		if !slices.Contains(cp.down, i) && !slices.Contains(cp.flipped, i) {
			ok = append(ok, i)
		}
	}
	return ok[cp.r.IntN(len(ok))]
}

// settle waits until every running shard is active: one that came back
// is not a whole holder of its stripes until its repair ends, and a new
// failure before that would be one more than the model allows.
func (cp *campaign) settle() {
	waitFor(cp.t, cp.v, "the running shards active", func(st Status) bool {
		for i, s := range st.Shards {
			if !slices.Contains(cp.down, i) && s.State != ShardActive {
				return false
			}
		}
		return true
	})
}

func (cp *campaign) fault(round int) {
	t, m := cp.t, cp.c.layout.Parity
	switch k := cp.r.IntN(6); {
	case k == 0 && cp.failed() < m:
		cp.settle()
		i := cp.healthy()
		cp.logf("round %d: stop shard %d", round, i)
		if err := cp.c.cl.Stop(i); err != nil {
			t.Fatal(err)
		}
		cp.down = append(cp.down, i)
		cp.faults["stop"]++
		waitFor(t, cp.v, fmt.Sprintf("shard %d offline", i), func(st Status) bool { return st.Shards[i].State == ShardOffline })
	case k == 1 && len(cp.down) > 0:
		j := cp.r.IntN(len(cp.down))
		i := cp.down[j]
		cp.logf("round %d: start shard %d", round, i)
		if err := cp.c.cl.Start(i); err != nil {
			t.Fatal(err)
		}
		cp.down = slices.Delete(cp.down, j, j+1)
		cp.faults["start"]++
	case k == 2 && cp.failed() < m:
		stripe, ok := cp.writtenStripe()
		if !ok {
			return
		}
		cp.settle()
		i := cp.healthy()
		if i < cp.c.layout.Data && !cp.written[int(stripe)*cp.c.layout.Data+i] {
			return // that data block was never written: it has no hash to fail
		}
		cp.logf("round %d: flip a bit in shard %d's block of stripe %d", round, i, stripe)
		if err := cp.c.cl.Stop(i); err != nil {
			t.Fatal(err)
		}
		waitFor(t, cp.v, fmt.Sprintf("shard %d offline", i), func(st Status) bool { return st.Shards[i].State == ShardOffline })
		flipBit(t, cp.c.cl.RegionDir(i), stripe)
		if err := cp.c.cl.Start(i); err != nil {
			t.Fatal(err)
		}
		cp.flipped = append(cp.flipped, i)
		cp.faults["flip"]++
	case k == 4 && cp.failed() < m:
		cp.settle()
		i := cp.healthy()
		cp.logf("round %d: replace shard %d by an empty region", round, i)
		if err := cp.c.cl.Stop(i); err != nil {
			t.Fatal(err)
		}
		waitFor(t, cp.v, fmt.Sprintf("shard %d offline", i), func(st Status) bool { return st.Shards[i].State == ShardOffline })
		dir := cp.c.cl.RegionDir(i)
		if err := os.RemoveAll(dir); err != nil {
			t.Fatal(err)
		}
		if err := downstairs.Create(dir, cp.c.cl.Spec); err != nil {
			t.Fatal(err)
		}
		if err := cp.c.cl.Start(i); err != nil {
			t.Fatal(err)
		}
		cp.faults["replace"]++
	case k == 3:
		cp.gen++
		cp.logf("round %d: takeover at generation %d with shards %v stopped", round, cp.gen, cp.down)
		if err := cp.v.Close(); err != nil {
			t.Fatalf("Close before the takeover: %v", err)
		}
		cp.v = cp.c.open(cp.gen)
		cp.faults["takeover"]++
	default:
		cp.logf("round %d: no fault", round)
	}
}

// writtenStripe returns a stripe some block of which was written.
func (cp *campaign) writtenStripe() (int64, bool) {
	k := cp.c.layout.Data
	var stripes []int64
	for b, w := range cp.written {
		if w {
			stripes = append(stripes, int64(b/k))
		}
	}
	stripes = slices.Compact(stripes)
	if len(stripes) == 0 {
		return 0, false
	}
	return stripes[cp.r.IntN(len(stripes))], true
}

// io issues one write, read or flush and checks it.
func (cp *campaign) io() {
	t := cp.t
	blocks := len(cp.written)
	k := cp.c.layout.Data
	switch cp.r.IntN(6) {
	case 0, 1, 2: // a write: one block, a partial run, or whole stripes
		var first, n int
		switch cp.r.IntN(3) {
		case 0:
			first, n = cp.r.IntN(blocks), 1
		case 1:
			n = 1 + cp.r.IntN(3*k)
			first = cp.r.IntN(blocks - n + 1)
		default:
			n = k * (1 + cp.r.IntN(8))
			first = k * cp.r.IntN((blocks-n)/k+1)
		}
		cp.writes++
		p := pattern(uint64(cp.writes)<<8|0xec, int64(first)*testBlockSize, n*testBlockSize)
		cp.logf("  write blocks [%d, %d)", first, first+n)
		mustWrite(t, cp.v, p, int64(first)*testBlockSize)
		copy(cp.want[first*testBlockSize:], p)
		for b := first; b < first+n; b++ {
			cp.written[b] = true
		}
	case 3, 4: // a read of a random range, past any flipped block
		n := 1 + cp.r.IntN(4*k)
		first := cp.r.IntN(blocks - n + 1)
		cp.logf("  read blocks [%d, %d)", first, first+n)
		mustRead(t, cp.v, cp.want[first*testBlockSize:(first+n)*testBlockSize], int64(first)*testBlockSize)
	default:
		cp.logf("  flush")
		if err := cp.v.Flush(ctxT(t)); err != nil {
			t.Fatalf("Flush with %d of %d shards failed: %v", cp.failed(), cp.c.layout.Shards(), err)
		}
	}
}

// heal brings every shard back, waits for repair, scrubs, checks the
// whole volume, then checks it again with m shards stopped.
func (cp *campaign) heal() {
	t := cp.t
	for _, i := range cp.down {
		if err := cp.c.cl.Start(i); err != nil {
			t.Fatal(err)
		}
	}
	cp.logf("heal: start shards %v; %d flipped shards unscrubbed", cp.down, len(cp.flipped))
	cp.down = nil
	waitFor(t, cp.v, "every shard active", allActive)
	rep, err := cp.v.Scrub(ctxT(t))
	if err != nil {
		t.Fatalf("Scrub: %v", err)
	}
	if rep.BlocksRewritten > uint64(len(cp.flipped)) {
		t.Fatalf("Scrub after repair = %+v; want at most the %d flipped blocks rewritten", rep, len(cp.flipped))
	}
	if rep, err := cp.v.Scrub(ctxT(t)); err != nil || rep.BlocksRewritten != 0 {
		t.Fatalf("second Scrub = %+v, %v; want nothing rewritten", rep, err)
	}
	cp.flipped = nil
	mustRead(t, cp.v, cp.want, 0)
	stop := rand.New(rand.NewPCG(uint64(cp.writes), 1)).Perm(cp.c.layout.Shards())[:cp.c.layout.Parity]
	cp.logf("heal: stop shards %v and read everything", stop)
	for _, i := range stop {
		if err := cp.c.cl.Stop(i); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, cp.v, fmt.Sprintf("shards %v offline", stop), func(st Status) bool {
		for _, i := range stop {
			if st.Shards[i].State != ShardOffline {
				return false
			}
		}
		return true
	})
	mustRead(t, cp.v, cp.want, 0)
}
