package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"tern/instance/apiv1"
	"tern/instance/client"
	"tern/volume/extent"
	"tern/volume/volumetest"
)

// Sizes of the start benchmark's disks.
const (
	startFileDiskBytes   = 16 << 20
	startSlowVolumeBytes = 256 << 20
)

// newStartWorker makes dir's file disk and diverged volume and starts the
// vmm, which uses the volume's certificates.
func newStartWorker(dir string, opts StartOptions) (*startWorker, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("creating %s: %w", dir, err)
	}
	spec, err := extent.SpecForSize(startSlowVolumeBytes, 4096)
	if err != nil {
		return nil, err
	}
	cl, err := volumetest.NewCluster(dir, spec)
	if err != nil {
		return nil, fmt.Errorf("creating the slow volume: %w", err)
	}
	w := &startWorker{cluster: cl, blocks: scatteredBlocks(spec, opts.SlowDiverge)}
	if err := w.diverge(); err != nil {
		return nil, err
	}
	if w.disk, err = fileDisk(dir, startFileDiskBytes); err != nil {
		w.close()
		return nil, err
	}
	if w.vmm, err = startVMMProc(opts.Tern, filepath.Join(cl.Dir, "certs"), filepath.Join(dir, "vmm.log")); err != nil {
		w.close()
		return nil, err
	}
	return w, nil
}

// diverge (re)writes the diverged blocks on replicas 0 and 1 with a new
// round's data and a higher flush, with the replicas stopped, and serves
// all three again on their addresses.
func (w *startWorker) diverge() error {
	if err := w.cluster.Close(); err != nil {
		return fmt.Errorf("stopping the slow volume: %w", err)
	}
	w.round++
	for _, i := range []int{0, 1} {
		if err := divergeRegion(w.cluster.RegionDir(i), w.cluster.Spec, w.blocks, w.round); err != nil {
			return err
		}
	}
	if err := w.cluster.StartAll(); err != nil {
		return fmt.Errorf("serving the slow volume: %w", err)
	}
	return nil
}

func (w *startWorker) close() {
	if w.vmm != nil {
		w.vmm.stop()
		w.vmm = nil
	}
	w.cluster.Close()
}

func (w *startWorker) nextID(kind string) string {
	w.ids++
	return fmt.Sprintf("%s-%d", kind, w.ids)
}

// runFile ensures an instance with a file disk, asks it to run, waits
// for running, then stops it; healthz round trips follow.
func (w *startWorker) runFile(ctx context.Context, s *startSamples) error {
	c := w.vmm.client
	spec := startSpec(w.nextID("file"), apiv1.DiskSpec{Name: "root",
		Backend: apiv1.BackendSpec{Kind: apiv1.BackendFile, Path: w.disk}})
	if err := w.healthz(ctx, s); err != nil {
		return err
	}
	start, v, err := w.ensure(ctx, spec)
	ret := time.Since(start)
	if err != nil {
		return err
	}
	if err := c.RequestState(ctx, apiv1.Run); err != nil {
		return fmt.Errorf("running %s: %w", spec.ID, err)
	}
	snap, err := c.WaitFor(ctx, v.Gen, func(sn apiv1.View) bool {
		return sn.State == apiv1.Running || sn.State == apiv1.Failed || sn.State == apiv1.Destroyed
	})
	running := time.Since(start)
	if err != nil {
		return fmt.Errorf("waiting for %s to run: %w", spec.ID, err)
	}
	if snap.State != apiv1.Running {
		return fmt.Errorf("waiting for %s to run: it is %s", spec.ID, snap.State)
	}
	s.add(&s.ensureReturn, ret)
	s.add(&s.ensureRunning, running)
	return w.vmm.stopInstance(ctx, snap.Gen)
}

// healthz times one GET /healthz, just before an ensure: the floor under
// the same conditions.
func (w *startWorker) healthz(ctx context.Context, s *startSamples) error {
	d, err := w.vmm.healthz(ctx)
	if err != nil {
		return err
	}
	s.add(&s.healthz, d)
	return nil
}

// ensureRetries bounds the ensures refused with instance_exists right
// after the last instance was seen destroyed.
const ensureRetries = 1000

// ensure sends the ensure and returns when the accepted attempt started.
// The server accepts an ensure once the last instance is seen destroyed;
// should it still refuse one with instance_exists (a regression; the
// report's ensure_retries_after_destroyed, which should be 0), the attempt
// is counted, repeated and not timed.
func (w *startWorker) ensure(ctx context.Context, spec apiv1.Spec) (time.Time, apiv1.Instance, error) {
	for range ensureRetries {
		start := time.Now()
		v, err := w.vmm.client.Ensure(ctx, spec)
		if client.IsCode(err, apiv1.CodeConflict) {
			w.ensureRetried++
			continue
		}
		if err != nil {
			return start, v, fmt.Errorf("ensuring %s: %w", spec.ID, err)
		}
		return start, v, nil
	}
	return time.Time{}, apiv1.Instance{}, fmt.Errorf("ensuring %s: the previous instance is still there after %d attempts", spec.ID, ensureRetries)
}

// slowSpec is an instance on the diverged volume at the next generation.
func (w *startWorker) slowSpec() apiv1.Spec {
	w.gen++
	wait := uint64(60_000)
	sp := w.cluster.Spec
	return startSpec(w.nextID("slow"), apiv1.DiskSpec{Name: "vol", Backend: apiv1.BackendSpec{
		Kind: apiv1.BackendVolume, Targets: w.cluster.Targets(), Gen: w.gen, QuorumWaitMs: &wait,
		Region: &apiv1.RegionSpec{BlockSize: sp.BlockSize, ExtentBlocks: sp.ExtentBlocks, ExtentCount: sp.ExtentCount}}})
}

// runSlowEnsure times the ensure of an instance on the diverged volume,
// then stops it during its activation.
func (w *startWorker) runSlowEnsure(ctx context.Context, s *startSamples) error {
	spec := w.slowSpec()
	if err := w.healthz(ctx, s); err != nil {
		return err
	}
	start, v, err := w.ensure(ctx, spec)
	ret := time.Since(start)
	if err != nil {
		return err
	}
	s.add(&s.ensureSlow, ret)
	return w.vmm.stopInstance(ctx, v.Gen)
}

// runSlowActivation re-diverges the volume (the stopped activations may
// have repaired some of it) and times one instance on it from ensure to
// running: the reconciliation the ensures did not wait for.
func (w *startWorker) runSlowActivation(ctx context.Context) (time.Duration, uint64, error) {
	if err := w.diverge(); err != nil {
		return 0, 0, err
	}
	c := w.vmm.client
	spec := w.slowSpec()
	start, v, err := w.ensure(ctx, spec)
	if err != nil {
		return 0, 0, err
	}
	if err := c.RequestState(ctx, apiv1.Run); err != nil {
		return 0, 0, fmt.Errorf("running %s: %w", spec.ID, err)
	}
	snap, err := c.WaitFor(ctx, v.Gen, func(sn apiv1.View) bool {
		return sn.State == apiv1.Running || sn.State == apiv1.Failed || sn.State == apiv1.Destroyed
	})
	took := time.Since(start)
	if err != nil {
		return 0, 0, fmt.Errorf("waiting for %s to run: %w", spec.ID, err)
	}
	if snap.State != apiv1.Running {
		return 0, 0, fmt.Errorf("waiting for %s to run: it is %s", spec.ID, snap.State)
	}
	var repaired uint64
	if d, err := c.Disk(ctx, "vol"); err == nil && d.Activation != nil {
		repaired = d.Activation.BytesDone
	}
	return took, repaired, w.vmm.stopInstance(ctx, snap.Gen)
}
