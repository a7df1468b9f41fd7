package main

import (
	"context"
	"fmt"
	"log/slog"

	"tern/vmm/devices"
)

// openVolumeDisk activates the volume on targets as the VM's disk.
func openVolumeDisk(ctx context.Context, f *vmmRunFlags, targets []string, log *slog.Logger) (devices.BlockBackend, func(), error) {
	return nil, nil, fmt.Errorf("--disk volume: not supported yet")
}
