package instance

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
)

// Phase is a live-migration phase (DESIGN §6), published in
// Snapshot.Migration.
type Phase uint8

// The migration phases, in the order a migration passes them; Error may
// follow any of them.
const (
	PhaseSync Phase = iota + 1
	PhaseRAMPush
	PhasePause
	PhaseRAMPushDirty
	PhaseDevice
	PhaseFinish
	PhaseError
)

var phaseNames = [...]string{
	PhaseSync:         "sync",
	PhaseRAMPush:      "ram_push",
	PhasePause:        "pause",
	PhaseRAMPushDirty: "ram_push_dirty",
	PhaseDevice:       "device",
	PhaseFinish:       "finish",
	PhaseError:        "error",
}

// String returns the phase's API name, or "Phase(N)" for an invalid value.
func (p Phase) String() string { return enumString(phaseNames[:], uint8(p), "Phase") }

// MarshalText returns the phase's API name ("ram_push").
func (p Phase) MarshalText() ([]byte, error) { return enumMarshal(phaseNames[:], uint8(p), "phase") }

// UnmarshalText parses an API name such as "ram_push".
func (p *Phase) UnmarshalText(text []byte) error {
	v, err := enumParse(phaseNames[:], text, "phase")
	*p = Phase(v)
	return err
}

// MigrationStatus is one direction of migration: its id, phase and
// progress. The zero value means no migration in that direction and is
// published as JSON null; otherwise it is {"id","phase","round",
// "bytes_sent","pages_remaining","dirty_pages_per_sec",
// "bandwidth_bytes_per_sec","estimated_downtime_ms"}, plus "total_ms" and
// "downtime_ms" at finish and "error" with phase error. It is a value
// with no pointers, so a published Snapshot shares nothing with the next
// one and needs no copying.
type MigrationStatus struct {
	ID    string
	Phase Phase
	// Round is the pre-copy round in progress or last sent (1: the full
	// copy).
	Round int
	// BytesSent counts page bytes sent (source) or received (target).
	BytesSent uint64
	// PagesRemaining is what the next round or the paused copy must send.
	PagesRemaining uint64
	// DirtyPagesPerSec is the guest's dirtying rate over the last round.
	DirtyPagesPerSec float64
	// BandwidthBytesPerSec is the measured transfer rate.
	BandwidthBytesPerSec float64
	// EstimatedDowntimeMs is PagesRemaining at that bandwidth.
	EstimatedDowntimeMs float64
	// TotalMs and DowntimeMs are set at finish.
	TotalMs, DowntimeMs float64
	// Error is the reason, set with PhaseError.
	Error string
}

type migrationStatusJSON struct {
	ID                   string  `json:"id"`
	Phase                Phase   `json:"phase"`
	Round                int     `json:"round"`
	BytesSent            uint64  `json:"bytes_sent"`
	PagesRemaining       uint64  `json:"pages_remaining"`
	DirtyPagesPerSec     float64 `json:"dirty_pages_per_sec"`
	BandwidthBytesPerSec float64 `json:"bandwidth_bytes_per_sec"`
	EstimatedDowntimeMs  float64 `json:"estimated_downtime_ms"`
	TotalMs              float64 `json:"total_ms,omitempty"`
	DowntimeMs           float64 `json:"downtime_ms,omitempty"`
	Error                string  `json:"error,omitempty"`
}

// Active reports whether m describes a migration (is not the zero value).
func (m MigrationStatus) Active() bool { return m != MigrationStatus{} }

// MarshalJSON writes null for the zero value, else the object.
func (m MigrationStatus) MarshalJSON() ([]byte, error) {
	if !m.Active() {
		return []byte("null"), nil
	}
	return json.Marshal(migrationStatusJSON(m))
}

// UnmarshalJSON reads null as the zero value, else the object.
func (m *MigrationStatus) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*m = MigrationStatus{}
		return nil
	}
	var j migrationStatusJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*m = MigrationStatus(j)
	return nil
}

// Migration is the instance's migration in each direction.
type Migration struct {
	In  MigrationStatus `json:"in"`
	Out MigrationStatus `json:"out"`
}

// Snapshot is one published state of an instance. Its fields change only
// together: everything in one snapshot was true at once.
type Snapshot struct {
	// Gen numbers snapshots: the first is 1 and each publish adds exactly 1.
	Gen       uint64    `json:"gen"`
	State     State     `json:"state"`
	Migration Migration `json:"migration"`
}

// ErrGone is returned once the publisher is closed: the instance is gone.
// The API maps it to 410.
var ErrGone = errors.New("instance gone")

// Publisher publishes an instance's snapshots and lets any number of
// watchers long-poll for the next one. Publish, Current, WaitAfter and Close
// are safe to call from any goroutine.
type Publisher struct {
	mu sync.Mutex
	// cur is the latest snapshot; its Gen only grows.
	cur Snapshot
	// changed is closed, and replaced by a fresh channel, by every publish;
	// Close closes it and does not replace it. Waiters block on it.
	changed chan struct{}
	// gone is set by Close.
	gone bool
}

// NewPublisher returns a publisher whose first snapshot, gen 1, has the
// given state and migration: (creating, none) for an instance ensured from
// a spec, (migrating, in={id, sync}) for a migration target.
func NewPublisher(state State, migration Migration) *Publisher {
	return NewPublisherAt(1, state, migration)
}

// NewPublisherAt is NewPublisher with a first gen other than 1 (at least
// 1): a process that hosts one instance after another starts each new
// publisher past the last one's final gen, so a watcher's gens strictly
// increase across instances too.
func NewPublisherAt(first uint64, state State, migration Migration) *Publisher {
	return &Publisher{
		cur:     Snapshot{Gen: max(first, 1), State: state, Migration: migration},
		changed: make(chan struct{}),
	}
}

// Publish applies update to a copy of the current snapshot and publishes
// the result as the next generation, waking every waiter. All changes made
// by one update appear in one snapshot, so a watcher never sees half of
// them (seed 001: migration.out.phase=error and state=running together).
// update runs under the publisher's lock: it must be quick and must not
// call the publisher. Its change to Gen, if any, is overwritten. After
// Close, Publish does nothing and returns ErrGone.
func (p *Publisher) Publish(update func(*Snapshot)) (Snapshot, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.gone {
		return Snapshot{}, ErrGone
	}
	next := p.cur
	update(&next)
	next.Gen = p.cur.Gen + 1
	p.cur = next
	close(p.changed)
	p.changed = make(chan struct{})
	return next, nil
}

// Current returns the latest snapshot, also after Close.
func (p *Publisher) Current() Snapshot {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cur
}

// WaitAfter returns the latest snapshot as soon as its gen is greater than
// gen: at once if it already is, otherwise when a publish makes it so. A
// watcher passes the gen it last saw and so never misses the latest state,
// though it may skip intermediate ones. It returns ErrGone once the
// publisher is closed and holds nothing newer than gen (a watcher that is
// behind still gets the final snapshot first), and ctx.Err() if ctx ends
// first. It blocks on a channel, never polls.
func (p *Publisher) WaitAfter(ctx context.Context, gen uint64) (Snapshot, error) {
	for {
		p.mu.Lock()
		cur, changed, gone := p.cur, p.changed, p.gone
		p.mu.Unlock()
		switch {
		case cur.Gen > gen:
			return cur, nil
		case gone:
			return Snapshot{}, ErrGone
		}
		select {
		case <-changed:
			// Something was published or the publisher closed; look again.
			// Each wake-up follows a publish, so this loop turns once per
			// generation at most.
		case <-ctx.Done():
			return Snapshot{}, ctx.Err()
		}
	}
}

// Close marks the instance gone: waiters that are caught up return ErrGone,
// and Publish fails from now on. Current keeps answering with the last
// snapshot. Close is idempotent.
func (p *Publisher) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.gone {
		return
	}
	p.gone = true
	close(p.changed)
}
