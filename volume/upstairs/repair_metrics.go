package upstairs

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/google/uuid"

	"tern/volume/ids"
)

// repairKind says which repair moved data: activation reconciliation or
// live repair.
type repairKind uint8

const (
	repairActivation repairKind = iota
	repairLive
)

func (k repairKind) String() string {
	if k == repairLive {
		return "live"
	}
	return "activation"
}

// RepairStats counts the work of every repair this upstairs ran
// (activation reconciliation and live repair), from New on.
type RepairStats struct {
	// BlocksCompared is the number of block hashes compared.
	BlocksCompared uint64
	// BlocksCopied and BytesCopied count the blocks (and their bytes)
	// written to destinations, and to an activation's source in place of
	// its torn blocks.
	BlocksCopied uint64
	BytesCopied  uint64
	// ExtentsRepaired counts extents a repair finished (copied or
	// stamped), once per extent per run.
	ExtentsRepaired uint64
	// BlocksRewritten counts read repairs: blocks a replica served
	// failing their hashes, rewritten there from a peer's good copy
	// (a read, or Scrub).
	BlocksRewritten uint64
}

// repairCounters back RepairStats; updated without Upstairs.mu.
type repairCounters struct {
	blocksCompared  atomic.Uint64
	blocksCopied    atomic.Uint64
	bytesCopied     atomic.Uint64
	extentsRepaired atomic.Uint64
	blocksRewritten atomic.Uint64
}

// RepairStats returns the repair totals so far.
func (u *Upstairs) RepairStats() RepairStats {
	return RepairStats{
		BlocksCompared:  u.stats.blocksCompared.Load(),
		BlocksCopied:    u.stats.blocksCopied.Load(),
		BytesCopied:     u.stats.bytesCopied.Load(),
		BlocksRewritten: u.stats.blocksRewritten.Load(),
		ExtentsRepaired: u.stats.extentsRepaired.Load(),
	}
}

// repairMetrics are the repair counters and run durations in the
// upstairs' metrics set, labelled by kind (activation, live).
type repairMetrics struct {
	kinds [repairLive + 1]repairKindMetrics
}

type repairKindMetrics struct {
	bytes    *metrics.Counter
	extents  *metrics.Counter
	duration *metrics.Histogram
}

func newRepairMetrics(set *metrics.Set, id uuid.UUID) *repairMetrics {
	m := &repairMetrics{}
	for _, k := range []repairKind{repairActivation, repairLive} {
		l := fmt.Sprintf(`{kind=%q,upstairs=%q}`, k, id)
		m.kinds[k] = repairKindMetrics{
			bytes:    set.GetOrCreateCounter("tern_upstairs_repair_bytes_total" + l),
			extents:  set.GetOrCreateCounter("tern_upstairs_repair_extents_total" + l),
			duration: set.GetOrCreateHistogram("tern_upstairs_repair_duration_seconds" + l),
		}
	}
	return m
}

// extentRepaired counts one extent finished by a repair of kind k.
func (u *Upstairs) extentRepaired(k repairKind) {
	u.stats.extentsRepaired.Add(1)
	u.rmet.kinds[k].extents.Inc()
}

// repairRan records the duration of one repair run of kind k.
func (u *Upstairs) repairRan(k repairKind, start time.Time) {
	u.rmet.kinds[k].duration.UpdateDuration(start)
}

// repairHooks are test callbacks at fixed points of a repair; a nil
// field (or nil *repairHooks) is skipped.
type repairHooks struct {
	// activationExtentDone runs after activation repaired extent e.
	activationExtentDone func(e ids.ExtentID)
	// liveExtentCompared runs during the live repair of replica r, once
	// extent e's versions or hashes are known and before it is copied.
	liveExtentCompared func(r int, e ids.ExtentID)
	// sourceMended runs after an activation (or restart) repair mended
	// the silently damaged blocks of extent e's clean source src, before
	// it copies to the destination again.
	sourceMended func(src int, e ids.ExtentID)
}
