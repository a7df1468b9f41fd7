package dataplane

import (
	"fmt"

	"github.com/VictoriaMetrics/metrics"
)

// Counter names one of the programs' packet counters (enum counter in
// bpf/v2p.c, in the same order).
type Counter int

const (
	CounterLocal         Counter = iota // guest to a VM on this host
	CounterEncapsulated                 // guest to a VM on another host
	CounterARPReplied                   // guest ARP requests answered
	CounterDelivered                    // tunnel to a VM on this host
	CounterForwarded                    // tunnel to a VM that moved, re-encapsulated
	CounterDropNoMapping                // guest: no entry for (VNI, destination)
	CounterDropNotIPv4                  // neither IPv4 nor ARP
	CounterDropARP                      // guest ARP not answered (not a request, or for no VM of its VNI)
	CounterDropSpoofed                  // guest: a source address not its own
	CounterDropNoPort                   // guest: a device the plane does not know
	CounterDropMalformed                // truncated or bad header
	CounterDropNotLocal                 // tunnel: (VNI, destination) is no VM here
	CounterDropWrongVNI                 // the destination's port is in another VNI
	CounterDropTTL                      // tunnel: a forwarded packet's TTL ran out
	CounterDropNoTunnel                 // tunnel: no tunnel metadata
	NumCounters
)

// The Go list and the C enum agree in length (a compile error otherwise).
const (
	_ = uint(NumCounters - Counter(v2pCounterCOUNTER_MAX))
	_ = uint(Counter(v2pCounterCOUNTER_MAX) - NumCounters)
)

var counterNames = [NumCounters]string{
	"local", "encapsulated", "arp_replied", "delivered", "forwarded",
	"drop_no_mapping", "drop_not_ipv4", "drop_arp", "drop_spoofed", "drop_no_port",
	"drop_malformed", "drop_not_local", "drop_wrong_vni", "drop_ttl", "drop_no_tunnel",
}

func (c Counter) String() string {
	if c < 0 || c >= NumCounters {
		return fmt.Sprintf("counter(%d)", int(c))
	}
	return counterNames[c]
}

// Counters are the packet counts, summed over CPUs, indexed by Counter.
type Counters [NumCounters]uint64

// Counters reads the programs' counters.
func (p *Plane) Counters() (Counters, error) {
	var out Counters
	var perCPU []uint64
	for c := range NumCounters {
		if err := p.objs.Counters.Lookup(uint32(c), &perCPU); err != nil {
			return out, fmt.Errorf("reading counter %s: %w", c, err)
		}
		for _, n := range perCPU {
			out[c] += n
		}
	}
	return out, nil
}

// RegisterMetrics adds the counters to set as
// tern_dataplane_packets_total{result="…"}, read from the kernel at each
// scrape, and the map sizes as tern_dataplane_v2p_entries and
// tern_dataplane_forwarding_entries. Call it once per set (a name twice
// in one set panics in the metrics library).
func (p *Plane) RegisterMetrics(set *metrics.Set) {
	for c := range NumCounters {
		set.NewGauge(fmt.Sprintf(`tern_dataplane_packets_total{result=%q}`, c.String()), func() float64 {
			var perCPU []uint64
			if err := p.objs.Counters.Lookup(uint32(c), &perCPU); err != nil {
				return 0
			}
			var n uint64
			for _, v := range perCPU {
				n += v
			}
			return float64(n)
		})
	}
	entries := func(forwarding bool) float64 {
		all, err := p.Entries()
		if err != nil {
			return 0
		}
		n := 0
		for _, e := range all {
			if !forwarding || e.Forwarding {
				n++
			}
		}
		return float64(n)
	}
	set.NewGauge("tern_dataplane_v2p_entries", func() float64 { return entries(false) })
	set.NewGauge("tern_dataplane_forwarding_entries", func() float64 { return entries(true) })
}
