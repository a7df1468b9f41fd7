package migration

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"time"

	"github.com/quic-go/quic-go"

	"tern/instance/apiv1"
	"tern/vmm"
	"tern/vmm/memory"
)

// TargetConfig is what the target side of a migration needs.
type TargetConfig struct {
	// Build builds the VM from the source's spec on mem (taking ownership
	// of mem), with vmm.NewMigrationTarget: loading nothing into it.
	Build func(spec []byte, mem *memory.Memory) (*vmm.VM, error)
	// Start starts the built VM's Run in a goroutine the caller owns. It
	// is called with the VM paused before Run, before any state is
	// loaded: the vCPUs park without executing an instruction until
	// commit resumes them (or the VM is stopped and closed on failure).
	Start func(vm *vmm.VM)
	// Versions are the protocol versions offered (default
	// SupportedVersions).
	Versions []apiv1.MigrationVersion
	// Offer is sent with the versions in the hello.
	Offer Offer
	// BeforeFinish, when set, runs once the source has paused (and run
	// its AfterPause) and the device state is applied, before the target
	// says it is ready to commit: the last step that may still fail the
	// migration, where volumes are activated with a higher generation.
	BeforeFinish func(ctx context.Context) error
	// Injector, when set, fails imports on purpose.
	Injector *Injector
	// OnProgress receives every published Progress, in order.
	OnProgress func(apiv1.Progress)
	// Logger receives the migration's log lines (default: none).
	Logger *slog.Logger
}

// target is one incoming migration.
type target struct {
	cfg     TargetConfig
	log     *slog.Logger
	p       *peer
	pr      preamble
	vm      *vmm.VM
	prog    apiv1.Progress
	started bool
	// roundPages counts the pages of the round being received.
	roundPages uint64
	// devicesDone and finishSent record the steps commit needs.
	devicesDone, finishSent bool
	// times are this side's parts of the pause, sent with resumed.
	times targetTimes
}

// Receive dials nothing: conn is the connection the target dialed to the
// source. It migrates the VM in, and on success returns it running (its
// Run started by cfg.Start, resumed at commit). On failure the VM, if one
// was built, never ran a guest instruction and is stopped and closed. It
// owns conn and closes it.
func Receive(ctx context.Context, conn *quic.Conn, cfg TargetConfig) (*vmm.VM, Result, error) {
	t := &target{cfg: cfg, log: cfg.Logger, p: &peer{conn: conn}}
	t.prog.ID = cfg.Offer.MigrationID
	if t.log == nil {
		t.log = slog.New(slog.DiscardHandler)
	}
	if t.cfg.Versions == nil {
		t.cfg.Versions = SupportedVersions
	}
	if cfg.Build == nil {
		conn.CloseWithError(quic.ApplicationErrorCode(codeInternal), "no target builder")
		return nil, Result{}, errors.New("migrating in: no Build in the target config")
	}
	stop := context.AfterFunc(ctx, func() { conn.CloseWithError(quic.ApplicationErrorCode(codeInternal), "migration cancelled") })
	defer stop()
	start := time.Now()
	res, err := t.run(ctx)
	res.Total = time.Since(start)
	if err != nil {
		t.p.abort(err)
		if t.vm != nil {
			t.vm.Stop()
			t.vm.Close()
		}
		t.prog.Phase, t.prog.Error = apiv1.PhaseError, err.Error()
		t.publish()
		return nil, res, fmt.Errorf("migrating in: %w", err)
	}
	// The source closes the connection once it read resumed.
	t.p.waitClosed(5 * time.Second)
	conn.CloseWithError(0, "migrated")
	t.prog.TotalMs = ms(res.Total)
	t.publish()
	return t.vm, res, nil
}

func (t *target) publish() {
	if t.cfg.OnProgress != nil {
		t.cfg.OnProgress(t.prog)
	}
}

func (t *target) run(ctx context.Context) (res Result, err error) {
	if t.p.s, err = t.p.conn.OpenStreamSync(ctx); err != nil {
		return res, fmt.Errorf("opening the migration stream: %w", remote(err))
	}
	if err := t.p.send(hello{Versions: t.cfg.Versions, Offer: t.cfg.Offer}); err != nil {
		return res, err
	}
	w, err := expect[welcome](t.p)
	if err != nil {
		return res, err
	}
	if !slices.Contains(t.cfg.Versions, w.Version) {
		return res, fmt.Errorf("%w: the source chose version %d, offered %v", ErrNoCommonVersion, w.Version, t.cfg.Versions)
	}
	res.Version = w.Version
	t.prog.Phase = apiv1.PhaseSync
	t.publish()
	if t.pr, err = expect[preamble](t.p); err != nil {
		return res, err
	}
	if err := t.cfg.Injector.failImport(apiv1.PhaseSync); err != nil {
		return res, err
	}
	if t.pr.VCPUs == 0 || len(t.pr.Regions) == 0 {
		return res, fmt.Errorf("%w: %d vCPUs, %d regions", ErrIncompatible, t.pr.VCPUs, len(t.pr.Regions))
	}
	var mem *memory.Memory
	if t.pr.Method == MethodMemfd {
		// The source's own pages, shared: mapped and built on before
		// ready, while the guest still runs at the source (memfd.go).
		fds, err := receiveFds(ctx, t.pr.Socket, t.pr.Nonce, len(t.pr.Regions))
		if err != nil {
			return res, err
		}
		if mem, err = memory.FromFds(t.pr.Regions, fds); err != nil {
			return res, fmt.Errorf("%w: %w", ErrIncompatible, err)
		}
	} else if mem, err = memory.New(t.pr.Regions...); err != nil {
		return res, fmt.Errorf("%w: %w", ErrIncompatible, err)
	}
	if err := t.build(mem); err != nil {
		return res, err
	}
	if err := t.p.send(empty{msgReady}); err != nil {
		return res, err
	}
	for {
		m, err := t.p.recv()
		if err != nil {
			return res, err
		}
		done, err := t.handle(ctx, m, &res)
		if err != nil || done {
			return res, err
		}
	}
}

// build builds and starts the VM, parked, on mem.
func (t *target) build(mem *memory.Memory) error {
	vm, err := t.cfg.Build(t.pr.Spec, mem)
	if err != nil {
		return fmt.Errorf("building the target VM: %w: %w", ErrIncompatible, err)
	}
	t.vm = vm
	var got []memory.RegionSpec
	for _, r := range vm.Memory().Regions() {
		got = append(got, r.Spec())
	}
	if !slices.Equal(got, t.pr.Regions) || len(vm.KVMVCPUs()) != int(t.pr.VCPUs) {
		return fmt.Errorf("building the target VM: %w: built %v with %d vCPUs, the source has %v with %d",
			ErrIncompatible, got, len(vm.KVMVCPUs()), t.pr.Regions, t.pr.VCPUs)
	}
	if err := vm.Pause(); err != nil {
		return err
	}
	if t.cfg.Start != nil {
		t.cfg.Start(vm)
	}
	t.started = true
	return nil
}

// handle acts on one message after the preamble; done at commit.
func (t *target) handle(ctx context.Context, m any, res *Result) (done bool, err error) {
	switch m := m.(type) {
	case phaseMsg:
		if m.Phase <= t.prog.Phase || m.Phase == apiv1.PhaseError ||
			m.Phase == apiv1.PhaseFinish && !t.devicesDone || m.Phase > apiv1.PhasePause && t.vm == nil {
			return false, fmt.Errorf("receiving phase: %w: %v after %v", ErrMalformed, m.Phase, t.prog.Phase)
		}
		t.prog.Phase = m.Phase
		t.publish()
		if err := t.cfg.Injector.failImport(m.Phase); err != nil {
			return false, err
		}
		if m.Phase == apiv1.PhaseFinish {
			if t.cfg.BeforeFinish != nil {
				if err := t.cfg.BeforeFinish(ctx); err != nil {
					return false, fmt.Errorf("before finish: %w", err)
				}
			}
			t.finishSent = true
			return false, t.p.send(empty{msgFinishReady})
		}
	case pagesHeader:
		if t.vm == nil || t.pr.Method != MethodPages {
			return false, fmt.Errorf("receiving pages: %w: unexpected pages", ErrMalformed)
		}
		if err := checkPages(m, t.pr.Regions); err != nil {
			return false, err
		}
		r := t.vm.Memory().Regions()[m.Region].Bytes()
		dst := r[m.First*memory.PageSize : (m.First+uint64(m.Count))*memory.PageSize]
		if _, err := io.ReadFull(t.p.s, dst); err != nil {
			return false, fmt.Errorf("receiving pages: %w", remote(err))
		}
		t.roundPages += uint64(m.Count)
		t.prog.BytesSent += uint64(len(dst))
	case roundEnd:
		if m.Pages != t.roundPages {
			return false, fmt.Errorf("receiving round %d: %w: %d pages, the source says %d", m.Round, ErrMalformed, t.roundPages, m.Pages)
		}
		t.roundPages = 0
		t.prog.Round = int(m.Round)
		res.Rounds = int(m.Round)
		t.publish()
		return false, t.p.send(roundAck{m.Round})
	case devicesMsg:
		if t.vm == nil {
			return false, fmt.Errorf("receiving device state: %w: before memory", ErrMalformed)
		}
		if t.prog.Phase != apiv1.PhaseDevice || t.devicesDone {
			return false, fmt.Errorf("receiving device state: %w: in phase %v", ErrMalformed, t.prog.Phase)
		}
		t0 := time.Now()
		if err := t.vm.RestoreState(m.Devices); err != nil {
			return false, fmt.Errorf("applying device state: %w", classifyStateError(err))
		}
		t.times.Restore = time.Since(t0)
		t.devicesDone = true
		return false, t.p.send(empty{msgDevicesOK})
	case empty:
		if m.Type != msgCommit || t.vm == nil || !t.finishSent {
			return false, fmt.Errorf("receiving message: %w: unexpected %v", ErrMalformed, m.Type)
		}
		// Committed: the guest is ours.
		t0 := time.Now()
		if err := t.vm.Resume(); err != nil {
			return false, err
		}
		t.vm.ResumeVirtio() // no-op but for a Linux guest's, held since RestoreState
		t.vm.WaitResumed()
		t.times.Resume = time.Since(t0)
		res.BytesSent = t.prog.BytesSent
		res.Pause.RestoreUs, res.Pause.ResumeUs = t.times.Restore.Microseconds(), t.times.Resume.Microseconds()
		t.prog.PauseBreakdown = res.Pause
		if res.Version < versionTargetTimes {
			return true, t.p.send(empty{msgResumed})
		}
		return true, t.p.send(resumedMsg{t.times})
	default:
		return false, fmt.Errorf("receiving message: %w: unexpected %T", ErrMalformed, m)
	}
	return false, nil
}
