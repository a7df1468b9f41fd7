package instance

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/quic-go/quic-go"

	"tern/instance/apiv1"
	"tern/migration"
	"tern/vmm"
	"tern/vmm/memory"
	"tern/volume/transport"
)

// migrationDialTimeout bounds a migration target's dial of its source.
const migrationDialTimeout = 30 * time.Second

// migrationIdleTimeout is how long either side of a migration waits for
// any packet from the other before the attempt fails. A volume's replica
// connection gives up after 4 s, as a dead downstairs must be noticed
// fast and the volume carries on with the others; a migration has no
// other peer, and a stall of a few seconds (a loaded host, an emulated
// one) is better waited out than the whole copy thrown away. A target
// that died while the source is paused still resumes the source within
// this bound.
const migrationIdleTimeout = 15 * time.Second

// migrationConfig is what the controller needs to migrate either way;
// immutable after Start.
type migrationConfig struct {
	host           Host
	tls            *tls.Config
	versions       []apiv1.MigrationVersion
	apiURL         string
	sameHostPrefix string
}

func migrationConfigOf(cfg Config) migrationConfig {
	m := migrationConfig{host: cfg.Host, versions: cfg.MigrationVersions, apiURL: cfg.APIURL, sameHostPrefix: cfg.SameHostSocketPrefix}
	if cfg.MigrationTLS != nil {
		m.tls = cfg.MigrationTLS.Clone()
		m.tls.NextProtos = []string{migration.NextProto}
	}
	return m
}

// codeMigrationRefused closes a migration connection the policy denied.
const codeMigrationRefused = 6

// AcceptMigration hands the controller a migration connection a target
// dialed. The request policy judges migrate_out: when it is denied the
// connection is closed with the reason (which the target reports) and the
// *WrongStateError returned; otherwise the owner goroutine migrates the
// instance out over conn.
func (c *Controller) AcceptMigration(conn *quic.Conn) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	d, p := Decide(c.state, c.pending, apiv1.MigrateOut)
	if err := d.Err(c.state, apiv1.MigrateOut); err != nil {
		conn.CloseWithError(codeMigrationRefused, err.Error())
		return err
	}
	c.pending, c.outgoing = p, conn
	select {
	case c.wake <- struct{}{}:
	default:
	}
	return nil
}

// dropOutgoing closes a migration connection the owner goroutine never
// took (the instance halts or fails first).
func (c *Controller) dropOutgoing(why string) {
	c.mu.Lock()
	conn := c.outgoing
	c.outgoing = nil
	c.mu.Unlock()
	if conn != nil {
		conn.CloseWithError(codeMigrationRefused, why)
	}
}

// vmOf returns the *vmm.VM behind a machine, nil for one that has none
// (a test's fake).
func vmOf(m Machine) *vmm.VM {
	if v, ok := m.(interface{ VM() *vmm.VM }); ok {
		return v.VM()
	}
	return nil
}

// machineEnded reports whether one of vm's vCPUs has ended: the guest
// crashed, or its run is over.
func machineEnded(vm *vmm.VM) bool {
	if vm == nil {
		return false
	}
	for _, v := range vm.VCPUs() {
		select {
		case <-v.Done():
			return true
		default:
		}
	}
	return false
}

// migrateOut runs one migration out over the connection AcceptMigration
// took, on the owner goroutine; it reports whether the guest is the
// target's now (the instance then halts). Published: migrating with
// migration.out from the sync phase on; on failure, once the guest runs
// again, state running with out.phase error in one generation, which is
// also when migrate_out completes, so the next one is accepted from then;
// if the guest crashed meanwhile, migrating with out.phase error, and then
// failed with the crash report.
func (d *driver) migrateOut() (migrated bool) {
	c := d.c
	c.mu.Lock()
	conn := c.outgoing
	c.outgoing = nil
	spec := c.built
	c.mu.Unlock()
	var (
		id, apiURL string
		settled    bool // migrate_out completed by a published error
	)
	vm := vmOf(d.machine)
	fail := func(st apiv1.Progress) {
		settled = true
		// A guest that crashed meanwhile (a vCPU ended: the source could
		// not resume it) is never published running: the instance stays
		// migrating with the error until Run's end fails it.
		state := apiv1.Running
		if machineEnded(vm) {
			state = apiv1.Migrating
		}
		c.publishWith(state, func(s *apiv1.View) { s.Migration.Out = st }, apiv1.MigrateOut)
	}
	specJSON, err := json.Marshal(spec)
	switch {
	case err == nil && conn == nil:
		err = errors.New("no migration connection")
	case err == nil && vm == nil:
		err = errors.New("no VM to migrate")
	}
	if err != nil {
		if conn != nil {
			conn.CloseWithError(codeMigrationRefused, "migrate_out refused: "+err.Error())
		}
		fail(apiv1.Progress{Phase: apiv1.PhaseError, Error: fmt.Sprintf("migrating out: %v", err)})
		return false
	}
	cfg := migration.SourceConfig{
		VM: vm, Spec: specJSON, Versions: c.mig.versions, SameHostSocketPrefix: c.mig.sameHostPrefix,
		Logger: c.log.With("migration", "out"),
		OnOffer: func(o migration.Offer) error {
			id, apiURL = o.MigrationID, o.APIURL
			return nil
		},
		AfterPause: func() error { return d.flushDisks() },
		OnProgress: func(p apiv1.Progress) {
			if p.Phase == apiv1.PhaseError {
				fail(p) // the guest runs again: Send publishes error only after Resume
				return
			}
			c.publishWith(apiv1.Migrating, func(s *apiv1.View) { s.Migration.Out = p })
		},
	}
	if inj, ok := failureInjector(spec); ok {
		cfg.Injector = d.injector(inj)
	}
	res, err := migration.Send(d.ctx, conn, cfg)
	switch {
	case err == nil:
		c.mu.Lock()
		c.migratedTo = apiURL
		c.mu.Unlock()
		c.log.Info("migrated out", "migration_id", id, "to", apiURL, "total", res.Total, "downtime", res.Downtime)
		return true
	case errors.Is(err, migration.ErrCommitted):
		// The guest is the target's (or lost); this side never resumes it.
		c.log.Error("migration out failed after the point of no return", "migration_id", id, "err", err)
		c.mu.Lock()
		c.migratedTo = apiURL
		c.mu.Unlock()
		return true
	case !settled:
		fail(apiv1.Progress{ID: id, Phase: apiv1.PhaseError, Error: err.Error()})
	}
	c.log.Warn("migration out failed; the guest runs on", "migration_id", id, "err", err)
	return false
}

// injector returns the instance's failure injector, made once: its
// counts span migrations.
func (d *driver) injector(spec migration.InjectorSpec) *migration.Injector {
	if d.inj == nil {
		d.inj = migration.NewInjector(spec)
	}
	return d.inj
}

// flushDisks flushes every disk: with the vCPUs parked, every write the
// guest made is then stored (on a volume: on its replicas).
func (d *driver) flushDisks() error {
	ctx, cancel := context.WithTimeout(d.ctx, time.Minute)
	defer cancel()
	var errs []error
	for _, dk := range d.disks {
		if err := dk.backend.Flush(ctx); err != nil {
			errs = append(errs, fmt.Errorf("flushing disk %s: %w", dk.spec.Name, err))
		}
	}
	return errors.Join(errs...)
}

// migrateIn makes the instance from its source: dial, receive the
// source's spec, build the VM and disks on it, take the memory and device
// state, activate the volumes with their new generation, and, at commit,
// run. A stop requested meanwhile aborts it. On success the instance is
// running with migration.in at finish; on failure the caller fails the
// instance with the returned status as migration.in.
func (d *driver) migrateIn() (apiv1.Progress, error) {
	c := d.c
	in := c.spec.Init
	last := apiv1.Progress{ID: in.MigrationID, Phase: apiv1.PhaseSync}
	if c.mig.tls == nil {
		return errorStatus(last, errors.New("migrating in: this VMM has no certificates for migration")), errors.New("migrating in: no certificates")
	}
	ctx, cancel := context.WithCancel(d.ctx)
	// A stop aborts the import; the loop that would see the wake-up is
	// blocked here, and looks at Pending again afterwards.
	watched := make(chan struct{})
	defer func() { cancel(); <-watched }()
	go func() {
		defer close(watched)
		for {
			select {
			case <-c.wake:
				if c.pendingNow().Has(apiv1.Stop) {
					cancel()
					return
				}
			case <-ctx.Done():
				return
			}
		}
	}()
	dctx, dcancel := context.WithTimeout(ctx, migrationDialTimeout)
	conn, err := transport.DialWith(dctx, in.Source, c.mig.tls, transport.DialOptions{IdleTimeout: migrationIdleTimeout})
	dcancel()
	if err != nil {
		err = fmt.Errorf("migrating in: dialing the source %s: %w", in.Source, err)
		return errorStatus(last, err), err
	}
	downtime := uint64(apiv1.DefaultDowntimeTargetMs)
	if in.DowntimeTargetMs != nil {
		downtime = *in.DowntimeTargetMs
	}
	var pausedAt time.Time
	cfg := migration.TargetConfig{
		Build:    d.buildMigrated,
		Start:    d.runMigrated,
		Versions: c.mig.versions,
		Offer: migration.Offer{MigrationID: in.MigrationID, DowntimeTarget: time.Duration(downtime) * time.Millisecond,
			SameHost: in.SameHost, APIURL: c.mig.apiURL},
		BeforeFinish: d.activateMigrated,
		Logger:       c.log.With("migration", "in"),
		OnProgress: func(p apiv1.Progress) {
			last = p
			if p.Phase == apiv1.PhasePause && pausedAt.IsZero() {
				pausedAt = time.Now()
			}
			if p.Phase != apiv1.PhaseError {
				c.publishWith(apiv1.Migrating, func(s *apiv1.View) { s.Migration.In = last })
			}
		},
	}
	if inj, ok := failureInjector(c.spec); ok {
		cfg.Injector = d.injector(inj)
	}
	vm, res, err := migration.Receive(ctx, conn, cfg)
	if err != nil {
		// Receive stopped and closed the VM it built; the guest never ran.
		if d.runDone != nil {
			<-d.runDone
			d.runDone = nil
		}
		d.forgetMachine()
		if c.pendingNow().Has(apiv1.Stop) {
			err = fmt.Errorf("stopped: %w", err)
		}
		return errorStatus(last, err), err
	}
	hist := vm.Serial().Output()
	st := hist.State()
	c.console.Restore(st) // the source's console, at the source's offsets
	d.pump = startConsolePumpAt(hist, c.console, st.End)
	last.Phase = apiv1.PhaseFinish
	last.TotalMs = float64(res.Total) / float64(time.Millisecond)
	if !pausedAt.IsZero() {
		last.DowntimeMs = float64(time.Since(pausedAt)) / float64(time.Millisecond)
	}
	return last, nil
}

func errorStatus(last apiv1.Progress, err error) apiv1.Progress {
	last.Phase, last.Error = apiv1.PhaseError, err.Error()
	return last
}

// forgetMachine drops a machine something else closed.
func (d *driver) forgetMachine() {
	d.machine = nil
	d.c.mu.Lock()
	d.c.machine = nil
	d.c.mu.Unlock()
}

// buildMigrated is the migration target's Build: the source's spec merged
// with the ensure's, validated, its disks opened (volumes not activated
// yet), and a VM on mem that loads nothing.
func (d *driver) buildMigrated(specJSON []byte, mem *memory.Memory) (*vmm.VM, error) {
	c := d.c
	src, err := apiv1.DecodeSpec(specJSON)
	if err != nil {
		mem.Close()
		return nil, fmt.Errorf("reading the source's spec: %w", err)
	}
	spec, err := mergeMigrated(c.spec, src)
	if err == nil {
		check := spec
		check.Init = apiv1.InitSpec{Method: apiv1.InitSpecMethod}
		err = Validate(&check, c.mig.host)
	}
	if err != nil {
		mem.Close()
		return nil, err
	}
	c.mu.Lock()
	c.built = spec
	c.mu.Unlock()
	for _, ds := range spec.Disks {
		dk, err := openDisk(ds, c.volumeTLS, c.log)
		if err != nil {
			mem.Close()
			return nil, err
		}
		d.disks = append(d.disks, dk)
		c.mu.Lock()
		c.disks = d.disks
		c.mu.Unlock()
	}
	vcfg := vmm.Config{MemoryBytes: spec.MemoryMiB << 20, VCPUs: spec.VCPUs, NICs: vmmNICs(spec), Logger: c.log}
	if g := spec.Guest; g.Kind == apiv1.GuestLinux {
		// The kernel is in the migrated memory; its paths are validated
		// (they must exist here too) but nothing is loaded from them.
		vcfg.Linux = &vmm.LinuxGuest{Kernel: g.Kernel, Initrd: g.Initrd, Cmdline: g.Cmdline}
	} else {
		vcfg.Guest = g.Path
	}
	for _, dk := range d.disks {
		vcfg.Disks = append(vcfg.Disks, dk.backend)
	}
	vm, err := vmm.NewMigrationTarget(vcfg, mem)
	if err != nil {
		return nil, fmt.Errorf("creating the migration target's VM: %w", err)
	}
	return vm, nil
}

// runMigrated is the migration target's Start: Run on a goroutine the
// driver waits for, the vCPUs parked until commit.
func (d *driver) runMigrated(vm *vmm.VM) {
	m := vmmMachine{vm}
	d.machine = m
	d.c.mu.Lock()
	d.c.machine = m
	d.c.mu.Unlock()
	done := make(chan runResult, 1)
	go func() {
		s, err := m.Run(d.ctx)
		done <- runResult{s, err}
	}()
	d.runDone = done
}

// activateMigrated is the migration target's BeforeFinish: the source has
// paused and flushed, so every volume is activated now, with its higher
// generation, which fences the source's upstairs.
func (d *driver) activateMigrated(ctx context.Context) error {
	for _, dk := range d.disks {
		if dk.up == nil {
			continue
		}
		dk.activate(ctx)
		if err := dk.activationErr(); err != nil {
			return fmt.Errorf("activating disk %s at generation %d: %w", dk.spec.Name, dk.spec.Backend.Gen, err)
		}
	}
	return nil
}

// mergeMigrated is the spec a migration target builds: the source's, with
// the ensure's init and components (never the source's), and each disk
// the ensure names given the ensure's backend. Every volume activates at
// a generation above the source's: the one given (which must be higher),
// or the source's + 1.
func mergeMigrated(ensure, src apiv1.Spec) (apiv1.Spec, error) {
	if src.ID != ensure.ID {
		return apiv1.Spec{}, fmt.Errorf("%w: the source's instance is %q, this ensure's %q", ErrInvalidSpec, src.ID, ensure.ID)
	}
	out := src
	out.Init, out.Components = ensure.Init, ensure.Components
	out.Disks = slices.Clone(src.Disks)
	replaced := make([]bool, len(out.Disks))
	var errs []error
	for _, e := range ensure.Disks {
		i := slices.IndexFunc(out.Disks, func(d apiv1.DiskSpec) bool { return d.Name == e.Name })
		if i < 0 {
			errs = append(errs, fmt.Errorf("%w: disks: the source has no disk %q", ErrInvalidSpec, e.Name))
			continue
		}
		srcGen := out.Disks[i].Backend.Gen
		b := e.Backend
		if b.Kind == apiv1.BackendVolume {
			switch {
			case b.Gen == 0:
				b.Gen = srcGen + 1
			case b.Gen <= srcGen:
				errs = append(errs, fmt.Errorf("%w: disks[%s].backend.gen %d: want more than the source's %d", ErrInvalidSpec, e.Name, b.Gen, srcGen))
			}
		}
		out.Disks[i].Backend, replaced[i] = b, true
	}
	for i := range out.Disks {
		if !replaced[i] && out.Disks[i].Backend.Kind == apiv1.BackendVolume {
			out.Disks[i].Backend.Gen++
		}
	}
	return out, errors.Join(errs...)
}
