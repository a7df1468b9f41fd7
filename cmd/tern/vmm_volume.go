package main

import (
	"context"
	"fmt"
	"log/slog"

	"tern/internal/blockio"
	"tern/volume/upstairs"
)

// openVolumeDisk activates the volume on targets (with --certs and --gen)
// as the VM's disk, the way the volume commands do: probe the replicas,
// then activate with all three or, after the quorum wait, two. The
// returned close flushes and closes the volume.
func openVolumeDisk(ctx context.Context, f *vmmRunFlags, targets []string, log *slog.Logger) (blockio.Device, func(), error) {
	vf := &f.volume
	vf.targets = targets
	vf.quorumWait = upstairs.DefaultActivationQuorumWait
	vf.activateTimeout = defaultActivateTimeout
	p, err := vf.prepare(ctx, nil, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("--disk volume: %w", err)
	}
	closeVolume := func() {
		if err := p.close(); err != nil {
			log.Warn("closing the volume disk", "err", err)
		}
	}
	if err := p.activate(ctx); err != nil {
		closeVolume()
		return nil, nil, fmt.Errorf("--disk volume: %w", err)
	}
	// Activated, the volume knows its geometry: it is the disk's
	// backend as it is.
	return p.io(), closeVolume, nil
}
