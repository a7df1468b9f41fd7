package chaos

import (
	"context"
	"fmt"
	"time"

	"tern/volume/ids"
	"tern/volume/upstairs"
)

// ActivateTimeout bounds an activation, reconciliation included.
const ActivateTimeout = 2 * time.Minute

// openUpstairs creates an upstairs on targets (the cluster's replicas, or
// proxies in front of them) and activates it at gen.
func openUpstairs(c *Cluster, targets []string, gen ids.Generation) (*upstairs.Upstairs, error) {
	return openUpstairsWith(c, targets, gen, nil)
}

// openUpstairsWith is openUpstairs with tune, if set, changing the
// configuration first.
func openUpstairsWith(c *Cluster, targets []string, gen ids.Generation, tune func(*upstairs.Config)) (*upstairs.Upstairs, error) {
	b, err := c.Bundle()
	if err != nil {
		return nil, fmt.Errorf("loading certificates: %w", err)
	}
	cfg := upstairs.Config{Targets: targets, TLS: b.ClientConfig("")}
	if tune != nil {
		tune(&cfg)
	}
	u, err := upstairs.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("creating upstairs: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), ActivateTimeout)
	defer cancel()
	if err := u.Activate(ctx, ids.Generation(gen)); err != nil {
		u.Close()
		return nil, fmt.Errorf("activating upstairs: %w", err)
	}
	return u, nil
}
