package migration

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"slices"
	"time"

	"github.com/quic-go/quic-go"

	"tern/instance/apiv1"
	"tern/vmm"
	"tern/vmm/memory"
)

// SourceConfig is what the source side of a migration needs.
type SourceConfig struct {
	// VM is the running VM to migrate. On success it is stopped; on
	// failure it runs on.
	VM *vmm.VM
	// Spec is the instance spec the target builds from, opaque here.
	Spec []byte
	// Policy decides when pre-copy stops.
	Policy Policy
	// Versions are the protocol versions offered (default
	// SupportedVersions).
	Versions []apiv1.MigrationVersion
	// Injector, when set, fails exports on purpose.
	Injector *Injector
	// OnProgress receives every published Progress, in order, on the
	// migration's goroutine; it must not block for long.
	OnProgress func(apiv1.Progress)
	// SameHostSocket, when set, is a unix socket path: the memfds are
	// handed over on it after the pause and no page is copied.
	SameHostSocket string
	// SameHostSocketPrefix, when set, is where the source makes its
	// hand-over socket (the prefix and a random name) when the target's
	// Offer asks for the same-host path; without it such an offer is
	// refused (ErrIncompatible). A prefix starting with '@' names Linux's
	// abstract socket namespace, where no file is made.
	SameHostSocketPrefix string
	// OnOffer, when set, sees the target's Offer before anything else
	// happens; an error refuses the migration with that reason.
	OnOffer func(Offer) error
	// AfterPause, when set, runs once the vCPUs are parked, before the
	// last dirty pages are sent: where the caller flushes its disks, so
	// every write the guest made is stored before the target takes over.
	// An error fails the migration (the guest resumes).
	AfterPause func() error
	// Logger receives the migration's log lines (default: none).
	Logger *slog.Logger
}

// Result sums up a finished migration.
type Result struct {
	// Version is the protocol version spoken.
	Version apiv1.MigrationVersion
	// Rounds counts the pre-copy rounds, the paused copy excluded.
	Rounds int
	// BytesSent counts page bytes moved.
	BytesSent uint64
	// Total is from the start to the target's resume, Downtime from the
	// source's pause to the target's resume.
	Total, Downtime time.Duration
	// Pause is where Downtime went (Send); Receive fills in only the
	// target's parts, RestoreUs and ResumeUs. A version 1 peer sends no
	// target times: Send's then holds them in OtherUs.
	Pause apiv1.PauseBreakdown
}

// maxRun bounds the pages of one pages frame the source sends.
const maxRun = 256

// progressEvery is how many bytes pass between progress reports within a
// round.
const progressEvery = 16 << 20

// source is one outgoing migration.
type source struct {
	cfg    SourceConfig
	log    *slog.Logger
	p      *peer
	t      *tracker
	prog   apiv1.Progress
	start  time.Time
	paused bool
	// quiesced: the VM's virtio transports are held (a Linux guest's).
	quiesced bool
	pauseAt  time.Time
	// pt splits the pause into its parts.
	pt      pauseTimer
	lastPub uint64
	// bandwidth sums bytes and time of acknowledged rounds.
	bwBytes uint64
	bwTime  time.Duration
}

// Send migrates cfg.VM out over conn, a connection the target dialed; it
// owns conn and closes it before it returns. On success the VM is stopped
// and the target runs the guest. On any failure before the point of no
// return the VM runs on (see the package doc for the order) and the error
// is returned after the VM resumed and phase error was published.
func Send(ctx context.Context, conn *quic.Conn, cfg SourceConfig) (Result, error) {
	s := &source{cfg: cfg, log: cfg.Logger, start: time.Now(), p: &peer{conn: conn}}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.cfg.Versions == nil {
		s.cfg.Versions = SupportedVersions
	}
	s.cfg.Policy = s.cfg.Policy.withDefaults()
	// Cancelling ctx aborts the migration: the connection closes and
	// every blocked read or write returns.
	stop := context.AfterFunc(ctx, func() { conn.CloseWithError(quic.ApplicationErrorCode(codeInternal), "migration cancelled") })
	defer stop()
	if cfg.VM == nil {
		conn.CloseWithError(quic.ApplicationErrorCode(codeInternal), "no VM")
		return Result{}, errors.New("migrating out: no VM")
	}
	res, committed, err := s.run(ctx)
	if err == nil {
		conn.CloseWithError(0, "migrated")
		return res, nil
	}
	if committed {
		conn.CloseWithError(quic.ApplicationErrorCode(codeInternal), err.Error())
		cfg.VM.Stop()
		return res, fmt.Errorf("migrating out: %w: %w", ErrCommitted, err)
	}
	return res, s.unwind(err)
}

// unwind is the failure path before the point of no return: re-mark,
// resume, tell the peer (a stalled peer must not hold the guest paused),
// and only then publish and report.
func (s *source) unwind(cause error) error {
	var errs []error
	if s.t != nil {
		errs = append(errs, s.t.stop(true))
	}
	if s.quiesced {
		s.cfg.VM.ResumeVirtio()
	}
	if s.paused {
		errs = append(errs, s.cfg.VM.Resume())
	}
	s.p.abort(cause)
	err := fmt.Errorf("migrating out: %w", cause)
	if e := errors.Join(errs...); e != nil {
		err = fmt.Errorf("migrating out: %w (and unwinding: %w)", cause, e)
	}
	s.prog.Phase, s.prog.Error = apiv1.PhaseError, err.Error()
	s.publish()
	s.log.Warn("migration out failed; guest resumed", "err", err)
	return err
}

func (s *source) publish() {
	if s.cfg.OnProgress != nil {
		s.cfg.OnProgress(s.prog)
	}
}

// enter publishes phase and tells the target (sync is implied by the
// preamble).
func (s *source) enter(ph apiv1.Phase) error {
	s.prog.Phase = ph
	s.publish()
	if ph == apiv1.PhaseSync {
		return nil
	}
	return s.p.send(phaseMsg{ph})
}

func (s *source) run(ctx context.Context) (res Result, committed bool, err error) {
	if len(s.cfg.VM.VCPUs()) == 0 {
		return res, false, errors.New("the VM is not running")
	}
	if s.p.s, err = s.p.conn.AcceptStream(ctx); err != nil {
		return res, false, fmt.Errorf("accepting the migration stream: %w", remote(err))
	}
	h, err := expect[hello](s.p)
	if err != nil {
		return res, false, err
	}
	s.prog.ID = h.Offer.MigrationID
	if s.cfg.OnOffer != nil {
		if err := s.cfg.OnOffer(h.Offer); err != nil {
			return res, false, err
		}
	}
	v, ok := highestCommon(s.cfg.Versions, h.Versions)
	if !ok {
		return res, false, fmt.Errorf("%w: this source speaks %v, the target %v", ErrNoCommonVersion, s.cfg.Versions, h.Versions)
	}
	if h.Offer.DowntimeTarget > 0 {
		s.cfg.Policy.DowntimeTarget = h.Offer.DowntimeTarget
	}
	if h.Offer.SameHost && s.cfg.SameHostSocket == "" {
		if s.cfg.SameHostSocketPrefix == "" {
			return res, false, fmt.Errorf("%w: the target asks for the same-host path, which this source does not offer", ErrIncompatible)
		}
		var name [8]byte
		rand.Read(name[:])
		s.cfg.SameHostSocket = fmt.Sprintf("%smigrate-%x.sock", s.cfg.SameHostSocketPrefix, name)
	}
	res.Version = v
	if err := s.p.send(welcome{v}); err != nil {
		return res, false, err
	}
	if err := s.enter(apiv1.PhaseSync); err != nil {
		return res, false, err
	}
	if err := s.cfg.Injector.failExport(apiv1.PhaseSync); err != nil {
		return res, false, err
	}
	pr := preamble{Spec: s.cfg.Spec, VCPUs: uint32(len(s.cfg.VM.KVMVCPUs())), Method: MethodPages}
	for _, r := range s.cfg.VM.Memory().Regions() {
		pr.Regions = append(pr.Regions, r.Spec())
	}
	var fds *fdServer
	if s.cfg.SameHostSocket != "" {
		pr.Method, pr.Socket = MethodMemfd, s.cfg.SameHostSocket
		rand.Read(pr.Nonce[:])
		if fds, err = listenFds(s.cfg.SameHostSocket, pr.Nonce); err != nil {
			return res, false, err
		}
		defer fds.Close()
	}
	if err := s.p.send(pr); err != nil {
		return res, false, err
	}
	if fds != nil {
		// The memory is shared, not sent: the target maps it and builds
		// its VM now, while the guest runs on here, so none of that is
		// downtime. Its vCPUs stay parked until commit.
		if err := s.handOver(ctx, fds); err != nil {
			return res, false, err
		}
	}
	if err := expectEmpty(s.p, msgReady); err != nil {
		return res, false, err
	}
	if fds == nil {
		if res.Rounds, err = s.precopy(); err != nil {
			return res, false, err
		}
	}
	if err := s.enter(apiv1.PhasePause); err != nil {
		return res, false, err
	}
	// Downtime counts from the pause request: the guest may stop at any
	// point of the call.
	pauseAt := time.Now()
	if err := s.cfg.VM.Pause(); err != nil {
		return res, false, err
	}
	s.paused, s.pauseAt = true, pauseAt
	s.pt.begin(pauseAt)
	s.pt.lap(&s.pt.b.StopUs)
	if s.cfg.VM.IsLinux() {
		// A Linux guest's virtio queues are served off the vCPUs: wait
		// for the requests in flight, so memory and the transports stand
		// still from here (tern's own guests' are served on the vCPU
		// that notified, which Pause already stopped).
		if err := s.cfg.VM.QuiesceVirtio(ctx); err != nil {
			return res, false, err
		}
		s.quiesced = true
		s.pt.lap(&s.pt.b.QuiesceUs)
	}
	if err := s.cfg.Injector.failExport(apiv1.PhasePause); err != nil {
		return res, false, err
	}
	s.pt.skip()
	if s.cfg.AfterPause != nil {
		if err := s.cfg.AfterPause(); err != nil {
			return res, false, fmt.Errorf("after pausing: %w", err)
		}
		s.pt.lap(&s.pt.b.FlushUs)
	}
	if err := s.enter(apiv1.PhaseRAMPushDirty); err != nil {
		return res, false, err
	}
	s.pt.skip()
	if fds == nil {
		if err := s.round(uint32(res.Rounds+1), apiv1.PhaseRAMPushDirty); err != nil {
			return res, false, err
		}
	}
	if err := s.enter(apiv1.PhaseDevice); err != nil {
		return res, false, err
	}
	if err := s.cfg.Injector.failExport(apiv1.PhaseDevice); err != nil {
		return res, false, err
	}
	s.pt.skip()
	devs, err := s.cfg.VM.SaveState()
	if err != nil {
		return res, false, fmt.Errorf("capturing device state: %w", err)
	}
	// The part ends before the frame's last byte leaves: the target's
	// restore, which starts once it has read that byte, must not overlap
	// it (a lap after the whole write could come after the target began,
	// when this goroutine is not scheduled at once).
	if err := s.p.sendThen(devicesMsg{devs}, func() { s.pt.lap(&s.pt.b.DeviceStateUs) }); err != nil {
		return res, false, err
	}
	// The target restores while this side waits: its part, not ours.
	if err := expectEmpty(s.p, msgDevicesOK); err != nil {
		return res, false, err
	}
	s.pt.skip()
	if err := s.enter(apiv1.PhaseFinish); err != nil {
		return res, false, err
	}
	if err := expectEmpty(s.p, msgFinishReady); err != nil {
		return res, false, err
	}
	s.pt.lap(&s.pt.b.FinishUs)
	if err := s.cfg.Injector.failExport(apiv1.PhaseFinish); err != nil {
		return res, false, err
	}
	// The point of no return: from the first byte of commit on, the guest
	// is the target's and this side never resumes it.
	if err := s.p.send(empty{msgCommit}); err != nil {
		return res, true, err
	}
	// The target resumes while this side waits: its part, not ours.
	times, err := expectResumed(s.p, res.Version)
	if err != nil {
		return res, true, err
	}
	now := time.Now()
	res.Pause, _ = s.pt.end(now, times)
	s.cfg.VM.Stop()
	if s.t != nil { // after the downtime: the VM is the target's now
		if err := s.t.stop(false); err != nil {
			s.log.Warn("ending dirty logging of the migrated-out VM", "err", err)
		}
	}
	res.BytesSent, res.Total, res.Downtime = s.prog.BytesSent, now.Sub(s.start), now.Sub(s.pauseAt)
	s.prog.TotalMs, s.prog.DowntimeMs = ms(res.Total), ms(res.Downtime)
	s.prog.PauseBreakdown = res.Pause
	s.prog.PagesRemaining, s.prog.EstimatedDowntimeMs = 0, 0
	s.publish()
	s.log.Info("migration out finished", "total", res.Total, "downtime", res.Downtime, "rounds", res.Rounds, "bytes", res.BytesSent,
		"pause_breakdown", res.Pause)
	return res, true, nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// highestCommon returns the highest version in both lists.
func highestCommon(ours, theirs []apiv1.MigrationVersion) (apiv1.MigrationVersion, bool) {
	best, ok := apiv1.MigrationVersion(0), false
	for _, v := range theirs {
		if slices.Contains(ours, v) && (!ok || v > best) {
			best, ok = v, true
		}
	}
	return best, ok
}

// precopy sends rounds until Decide says pause, and returns how many.
func (s *source) precopy() (int, error) {
	s.t = newTracker(s.cfg.VM)
	if err := s.t.start(); err != nil {
		return 0, err
	}
	if err := s.enter(apiv1.PhaseRAMPush); err != nil {
		return 0, err
	}
	s.t.markAll()
	for round := 1; ; round++ {
		s.prog.Round = round
		t0 := time.Now()
		if err := s.round(uint32(round), apiv1.PhaseRAMPush); err != nil {
			return round, err
		}
		elapsed := time.Since(t0)
		due, err := s.t.harvest()
		if err != nil {
			return round, err
		}
		d := Decide(s.cfg.Policy, Observation{RoundsDone: round, DirtyBytes: due * memory.PageSize, BandwidthBytesPerSec: s.bandwidth()})
		s.prog.PagesRemaining = due
		s.prog.DirtyPagesPerSec = float64(due) / elapsed.Seconds()
		s.prog.BandwidthBytesPerSec = s.bandwidth()
		s.prog.EstimatedDowntimeMs = ms(d.EstimatedDowntime)
		s.publish()
		s.log.Info("pre-copy round", "round", round, "due_pages", due, "bandwidth", s.bandwidth(),
			"estimated_downtime", d.EstimatedDowntime, "decision", d.Reason)
		if d.Pause {
			return round, nil
		}
	}
}

// bandwidth is the measured bytes per second of acknowledged rounds.
func (s *source) bandwidth() float64 {
	if s.bwTime <= 0 {
		return 0
	}
	return float64(s.bwBytes) / s.bwTime.Seconds()
}

// round sends the due pages (the paused copy harvests first) and waits
// for the target's acknowledgement.
func (s *source) round(n uint32, ph apiv1.Phase) error {
	paused := ph == apiv1.PhaseRAMPushDirty
	if paused {
		if _, err := s.t.harvest(); err != nil {
			return err
		}
		s.pt.lap(&s.pt.b.HarvestUs)
	}
	t0, before := time.Now(), s.prog.BytesSent
	pages, err := s.sendDue()
	if err != nil {
		return err
	}
	if err := s.cfg.Injector.failExport(ph); err != nil {
		return err
	}
	if err := s.p.send(roundEnd{Round: n, Pages: pages}); err != nil {
		return err
	}
	ack, err := expect[roundAck](s.p)
	if err != nil {
		return err
	}
	if ack.Round != n {
		return fmt.Errorf("receiving round acknowledgement: %w: round %d, want %d", ErrMalformed, ack.Round, n)
	}
	s.bwBytes += s.prog.BytesSent - before
	s.bwTime += time.Since(t0)
	if paused {
		s.pt.lap(&s.pt.b.LastPagesUs)
	}
	return nil
}

// zeroPage is compared against to skip zero pages the target holds.
var zeroPage [memory.PageSize]byte

// sendDue sends every due page straight from the guest mapping, in runs
// of consecutive pages, and clears it. It leaves out a page that is all
// zero and was never delivered in this attempt: the target's fresh memory
// already holds it. That is most of a first round, and after a failed
// attempt (which re-marks every page it had sent) most of the next one's
// second round too.
func (s *source) sendDue() (uint64, error) {
	var sent uint64
	for i, r := range s.t.regions {
		mem := r.Bytes()
		due := s.t.dirty[i]
		runStart, runLen := uint64(0), uint64(0)
		flush := func() error {
			if runLen == 0 {
				return nil
			}
			if err := s.p.send(pagesHeader{Region: uint16(i), First: runStart, Count: uint32(runLen)}); err != nil {
				return err
			}
			if _, err := s.p.s.Write(mem[runStart*memory.PageSize : (runStart+runLen)*memory.PageSize]); err != nil {
				return fmt.Errorf("sending pages: %w", remote(err))
			}
			sent += runLen
			s.prog.BytesSent += runLen * memory.PageSize
			runLen = 0
			if s.prog.BytesSent-s.lastPub >= progressEvery {
				s.lastPub = s.prog.BytesSent
				s.publish()
			}
			return nil
		}
		delivered := s.t.delivered[i]
		for w := range due {
			word := due[w]
			due[w] = 0
			s.t.sent[i][w] |= word
			for word != 0 {
				bit := word & -word
				page := uint64(w)*64 + uint64(bits.TrailingZeros64(word))
				word &= word - 1
				if delivered[w]&bit == 0 && bytes.Equal(mem[page*memory.PageSize:(page+1)*memory.PageSize], zeroPage[:]) {
					if err := flush(); err != nil {
						return sent, err
					}
					continue
				}
				if runLen > 0 && (runStart+runLen != page || runLen == maxRun) {
					if err := flush(); err != nil {
						return sent, err
					}
				}
				if runLen == 0 {
					runStart = page
				}
				runLen++
				delivered[w] |= bit
			}
		}
		if err := flush(); err != nil {
			return sent, err
		}
	}
	return sent, nil
}
