package multihost

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"tern/control/controlapi"

	"tern/instance/apiv1"
	"tern/instance/client"
	"tern/vmm/guests"
)

// consoleFrom reads the console of the vmm at url from offset to its
// end, page by page, and returns the text and the end offset.
func consoleFrom(ctx context.Context, url string, offset uint64) (string, uint64, error) {
	c, err := client.New(url, nil)
	if err != nil {
		return "", 0, err
	}
	var sb strings.Builder
	for {
		h, err := c.SerialHistory(ctx, offset, apiv1.MaxSerialMaxBytes)
		if err != nil {
			return "", 0, err
		}
		sb.WriteString(h.Data)
		if h.NextOffset == offset {
			return sb.String(), offset, nil
		}
		offset = h.NextOffset
	}
}

// longestGap is the longest "dirty: progress gap N us" in text: the
// downtime the guest measured, 0 when it saw no gap above 1 ms.
func longestGap(text string) time.Duration {
	var gap time.Duration
	for _, l := range strings.Split(text, "\n") {
		if g, ok := guests.ParseDirtyGap(strings.TrimRight(l, "\r")); ok {
			gap = max(gap, g)
		}
	}
	return gap
}

// drainedInstances is how many instances BenchmarkDrainOfEightInstances
// moves.
const drainedInstances = 8

// BenchmarkDrainOfEightInstances times a drain of a host that runs eight
// dirty guests (each on a volume across the three hosts, dirtying
// 4 MiB/s) with the default two migrations at a time: the drain's total
// time, and each guest's downtime as the guest measured it (its longest
// progress gap over the drain) beside the one its vmm reported, and the
// vmm-reported downtime of the lone migrations that gathered the guests
// on the host before it (the limit: no drain around them). Run it
// once: go test ./control/multihost -run '^$' -bench DrainOfEight
// -benchtime 1x -v.
func BenchmarkDrainOfEightInstances(b *testing.B) {
	for range b.N {
		b.StopTimer()
		c := newCluster(b)
		const host = "h2"
		mem, g, ws := dirtySize()
		var names []string
		for i := range drainedInstances {
			name := fmt.Sprintf("b%d", i+1)
			names = append(names, name)
			c.mustCtl(nil, "instance", "create", name, "--guest", "dirty", "--memory", fmt.Sprintf("%dMiB", mem), "--volume", "4MiB",
				"--param", fmt.Sprintf("mem_mib=%d", g), "--param", fmt.Sprintf("working_set_mib=%d", ws),
				"--param", "dirty_mib_per_sec=4", "--param", "verify_every_sec=1")
		}
		// Gather them on the host to drain.
		ends := map[string]uint64{}
		ctx, cancel := context.WithTimeout(context.Background(), generous)
		for _, n := range names {
			if h, _ := c.waitRunning(n); h != host {
				c.mustCtl(nil, "instance", "migrate", n, "--to", host)
			}
			_, url := c.waitRunning(n)
			_, end, err := consoleFrom(ctx, url, 0)
			if err != nil {
				b.Fatal(err)
			}
			ends[n] = end
		}
		b.StartTimer()
		start := time.Now()
		var d map[string]any
		c.mustCtl(&d, "host", "drain", host)
		total := time.Since(start)
		b.StopTimer()
		if d["state"] != "done" {
			b.Fatalf("drain ended %v", d)
		}
		var migs []controlapi.Migration
		c.mustCtl(&migs, "migration", "list")
		vmmDowntime := map[string]float64{}
		var list []controlapi.InstanceView
		c.mustCtl(&list, "instance", "list")
		ids := map[string]string{}
		for _, v := range list {
			ids[v.ID] = v.Name
		}
		// The limit: the gathering's migrations to host ran one at a
		// time, with no drain around them.
		var lone []float64
		for _, m := range migs {
			switch {
			case m.SourceHost == host:
				vmmDowntime[ids[m.InstanceID]] = m.DowntimeMs
			case m.TargetHost == host:
				lone = append(lone, m.DowntimeMs)
			}
		}
		slices.Sort(lone)
		if len(lone) > 0 {
			b.Logf("the limit, %d lone migrations to %s before the drain: vmm-reported downtime %.1f–%.1f ms", len(lone), host, lone[0], lone[len(lone)-1])
			b.ReportMetric(lone[len(lone)/2], "lone-migration-vmm-downtime-ms")
		}
		var gaps []time.Duration
		for _, n := range names {
			h, url := c.waitRunning(n)
			text, _, err := consoleFrom(ctx, url, ends[n])
			if err != nil {
				b.Fatal(err)
			}
			gap := longestGap(text)
			gaps = append(gaps, gap)
			b.Logf("%s → %s: guest-measured downtime %.1f ms, vmm-reported %.1f ms", n, h, float64(gap)/1e6, vmmDowntime[n])
		}
		cancel()
		slices.Sort(gaps)
		b.ReportMetric(float64(total.Milliseconds()), "drain-ms")
		b.ReportMetric(float64(gaps[len(gaps)/2])/1e6, "median-guest-downtime-ms")
		b.ReportMetric(float64(gaps[len(gaps)-1])/1e6, "max-guest-downtime-ms")
		c.neverTwoRunning()
	}
}
