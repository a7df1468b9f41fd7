package instance

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"tern/instance/apiv1"
	"tern/internal/blockio"
	"tern/vmm/devices"
	"tern/volume"
	"tern/volume/ec"
	"tern/volume/ids"
	"tern/volume/layout"
	"tern/volume/reconcile"
	"tern/volume/wire"
)

// disk is one opened disk. The owner goroutine creates and closes it;
// status readers take mu.
type disk struct {
	// Immutable after openDisk.
	spec    apiv1.DiskSpec
	backend blockio.Device
	file    *devices.FileBackend
	// up is a volume disk's volume, replicated or erasure-coded; nil
	// for a file disk.
	up volume.Volume
	// activated is closed when a volume's Activate returned; nil for a
	// file disk.
	activated chan struct{}

	mu sync.Mutex
	// actErr is Activate's error, set before activated is closed.
	actErr error
	closed bool
}

// openDisk opens a file disk or creates a volume disk's upstairs; it
// starts nothing.
func openDisk(spec apiv1.DiskSpec, clientTLS *tls.Config, log *slog.Logger) (*disk, error) {
	d := &disk{spec: spec}
	switch b := spec.Backend; b.Kind {
	case apiv1.BackendFile:
		f, err := devices.OpenFileBackend(b.Path, 512)
		if err != nil {
			return nil, fmt.Errorf("opening disk %s: %w", spec.Name, err)
		}
		d.file, d.backend = f, f
	case apiv1.BackendVolume:
		region := wire.RegionInfo{BlockSize: b.Region.BlockSize, ExtentBlocks: b.Region.ExtentBlocks, ExtentCount: b.Region.ExtentCount}
		var wait time.Duration
		if b.QuorumWaitMs != nil {
			wait = max(time.Duration(*b.QuorumWaitMs)*time.Millisecond, time.Millisecond)
		}
		l := layout.Replicated
		if b.ErasureCoded() {
			l = layout.ErasureCoded(ec.Layout{Data: b.Layout.Data, Parity: b.Layout.Parity})
		}
		up, err := layout.Open(l, layout.Config{
			Targets: b.Targets, TLS: clientTLS, Region: region,
			Logger: log.With("disk", spec.Name), ActivationQuorumWait: wait,
		})
		if err != nil {
			return nil, fmt.Errorf("opening disk %s: %w", spec.Name, err)
		}
		d.up, d.activated = up, make(chan struct{})
		d.backend = volumeBackend{up: up, blockSize: int(b.Region.BlockSize), size: b.VolumeSizeBytes()}
	default:
		return nil, fmt.Errorf("opening disk %s: unknown backend kind %q", spec.Name, b.Kind)
	}
	return d, nil
}

// activate runs a volume's activation to its end; the owner goroutine
// runs it on a goroutine it waits for. ctx aborts it.
func (d *disk) activate(ctx context.Context) {
	err := d.up.Activate(ctx, ids.Generation(d.spec.Backend.Gen))
	d.mu.Lock()
	d.actErr = err
	d.mu.Unlock()
	close(d.activated)
}

// activationErr is Activate's error once it ended.
func (d *disk) activationErr() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.actErr
}

// close frees the disk; a volume's activation must have ended.
func (d *disk) close() error {
	d.mu.Lock()
	d.closed = true
	d.mu.Unlock()
	if d.file != nil {
		return d.file.Close()
	}
	if err := d.up.Close(); err != nil && !errors.Is(err, volume.ErrClosed) {
		return fmt.Errorf("closing disk %s: %w", d.spec.Name, err)
	}
	return nil
}

// status describes the disk; replicas adds each downstairs.
func (d *disk) status(replicas bool) apiv1.DiskStatus {
	s := apiv1.DiskStatus{Name: d.spec.Name, Kind: d.spec.Backend.Kind}
	d.mu.Lock()
	closed, actErr := d.closed, d.actErr
	d.mu.Unlock()
	if d.file != nil {
		s.State = apiv1.DiskReady
		if closed {
			s.State = apiv1.DiskClosed
		}
		return s
	}
	p := d.up.ActivationProgress()
	s.Activation = repairProgress(&p)
	select {
	case <-d.activated:
		s.State = apiv1.DiskActive
		if actErr != nil {
			s.State, s.Error = apiv1.DiskFailed, actErr.Error()
		}
	default:
		s.State = apiv1.DiskActivating
	}
	if closed && s.State != apiv1.DiskFailed {
		s.State = apiv1.DiskClosed
	}
	if replicas {
		s.Replicas = downstairsStatus(d.up)
	}
	return s
}

// downstairsStatus describes each downstairs (replica or shard) of a
// volume disk.
func downstairsStatus(v volume.Volume) []apiv1.ReplicaStatus {
	var out []apiv1.ReplicaStatus
	for _, r := range v.Summary().Downstairs {
		out = append(out, apiv1.ReplicaStatus{
			Target: r.Target, State: r.State, LastError: r.LastError,
			FaultReason: r.FaultReason, Repair: repairProgress(r.Repair),
		})
	}
	return out
}

// repairProgress copies the volume planner's progress into the API's
// form, field by field; nil stays nil.
func repairProgress(p *reconcile.Progress) *apiv1.RepairProgress {
	if p == nil {
		return nil
	}
	return &apiv1.RepairProgress{
		Phase:          apiv1.RepairPhase(p.Phase),
		ExtentsTotal:   p.ExtentsTotal,
		ExtentsDone:    p.ExtentsDone,
		BlocksCompared: p.BlocksCompared,
		BytesTotal:     p.BytesTotal,
		BytesDone:      p.BytesDone,
		BytesPerSec:    p.BytesPerSec,
		EtaSeconds:     p.EtaSeconds,
		StartedAt:      p.StartedAt,
		UpdatedAt:      p.UpdatedAt,
	}
}

// volumeBackend is a volume disk as the virtio-blk device's backend: the
// volume's IO with the spec's geometry, which the device needs before
// the activation that tells the volume its own has ended.
type volumeBackend struct {
	up        volume.Volume
	blockSize int
	size      uint64
}

func (v volumeBackend) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	return v.up.ReadAt(ctx, p, off)
}

func (v volumeBackend) WriteAt(ctx context.Context, p []byte, off int64) (int, error) {
	return v.up.WriteAt(ctx, p, off)
}

func (v volumeBackend) Flush(ctx context.Context) error { return v.up.Flush(ctx) }
func (v volumeBackend) BlockSize() int                  { return v.blockSize }
func (v volumeBackend) SizeBytes() uint64               { return v.size }
