package upstairs

import (
	"context"
)

// reconcileActivation runs after the replicas taking part in an activation
// have activated their sessions (a.done says which; a.versions holds the
// extent versions each reported) and before guest IO starts. It is the
// seam for activation repair, which may use callReplica on those replicas
// here; an error fails Activate. Today it only reports extents whose
// versions differ between replicas.
func (u *Upstairs) reconcileActivation(_ context.Context, a *activation) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	ref := -1
	for r := range replicaCount {
		if !a.done[r] {
			continue
		}
		if ref < 0 {
			ref = r
			continue
		}
		differ := 0
		for i, v := range a.versions[r] {
			if i < len(a.versions[ref]) && a.versions[ref][i] != v {
				differ++
			}
		}
		if differ > 0 {
			u.log.Warn("replica extent versions differ; activation repair needed",
				"replica", r, "reference", ref, "extents", differ)
		}
	}
	return nil
}
