package upstairs

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"tern/volume/upstairs/engine"
)

// ErrUnknownTarget: ReplaceReplica was given an address that is not one of
// the volume's targets (or a new one that already is).
var ErrUnknownTarget = errors.New("unknown target")

// ReplaceReplica swaps the downstairs at address old for the one at new,
// which must serve a region with the same UUID and geometry (empty or
// stale). The replica is faulted at once (guest IO continues on the other
// two), its session moves to new, and live repair copies what differs. It
// returns when the replica is Active at new, or with an error when ctx
// ends, the volume stops, or the replica is replaced again meanwhile; the
// repair itself carries on (and is retried) until the volume closes.
func (u *Upstairs) ReplaceReplica(ctx context.Context, old, new string) error {
	u.mu.Lock()
	r := slices.Index(u.targets[:], old)
	switch {
	case !u.eng.Running():
		err := u.eng.StopErr()
		if err == nil {
			err = ErrNotActive
		}
		u.mu.Unlock()
		return fmt.Errorf("replacing replica %s: %w", old, err)
	case r < 0:
		u.mu.Unlock()
		return fmt.Errorf("replacing replica %s: %w: not a target of this volume", old, ErrUnknownTarget)
	case new == "" || slices.Contains(u.targets[:], new):
		u.mu.Unlock()
		return fmt.Errorf("replacing replica %s with %q: %w: already a target, or empty", old, new, ErrUnknownTarget)
	}
	u.targets[r] = new
	u.log.Info("replacing replica", "replica", r, "old", old, "new", new)
	// Faulting ends the session to old; the next one dials new.
	u.replicas[r].dropLocked(fmt.Errorf("replica %d: replaced %s by %s", r, old, new), func() { u.eng.Fault(r) })
	u.replicas[r].wakeUp()
	for {
		switch {
		case u.targets[r] != new:
			u.finishLocked()
			return fmt.Errorf("replacing replica %d with %s: replaced again by %s", r, new, u.targets[r])
		case u.eng.StopErr() != nil:
			err := u.eng.StopErr()
			u.finishLocked()
			return fmt.Errorf("replacing replica %d with %s: %w", r, new, err)
		case u.eng.State(r) == engine.ReplicaActive:
			u.finishLocked()
			return nil
		}
		ch := u.stateCh
		u.finishLocked()
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("replacing replica %d with %s: %w", r, new, ctx.Err())
		}
		u.mu.Lock()
	}
}
