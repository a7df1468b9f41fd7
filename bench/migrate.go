package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/coder/websocket"

	"tern/instance/apiv1"
	"tern/instance/client"
	"tern/instance/runner"
	"tern/internal/kvmhost"
	"tern/internal/tlsconf"
	"tern/vmm/guests"
	"tern/vmm/kvm"
)

// MigrateOptions configure RunMigrate.
type MigrateOptions struct {
	// Tern is the tern binary whose `vmm serve` processes migrate.
	Tern string
	// SizesMiB are the guests' memory sizes (default 256 and 1024).
	SizesMiB []uint64
	// RatesMiBPerSec are the dirty guest's rates (default 0, 10, 100);
	// 0 is the idle guest, which dirties nothing after its fill.
	RatesMiBPerSec []uint64
	// Progress, when set, gets a line as each step starts.
	Progress io.Writer
}

// MigrateScenario is one row of `tern bench migrate --json`: the first
// nine keys are the contract. Times are milliseconds; downtime_guest_ms
// is the longest progress gap the dirty guest printed from the start of
// the migration to its first verification after it, with its value
// however short (the guest reports each interval's largest gap). The
// qemu_ keys are QEMU's live migration of the same guest at the same size
// and rate at QEMU's default settings (query-migrate's total-time and
// downtime, and the guest's own longest gap read as for tern), and the
// qemu_at_tern_bw_ keys the same with QEMU's bandwidth limit
// (max-bandwidth, 128 MiB/s by default) set to the rate tern's QUIC
// migration of that row reached (lifted, when tern went faster than the
// default), so total and downtime compare at the same bandwidth; all
// null without QEMU. pause_breakdown is where tern's pause went, as the
// source measured it (apiv1.PauseBreakdown, microseconds; null when the
// migration reported none).
type MigrateScenario struct {
	MemoryMiB       uint64   `json:"memory_mib"`
	DirtyMiBPerSec  uint64   `json:"dirty_mib_per_sec"`
	TotalMs         float64  `json:"total_ms"`
	DowntimeGuestMs float64  `json:"downtime_guest_ms"`
	DowntimeVMMMs   float64  `json:"downtime_vmm_ms"`
	BytesSent       uint64   `json:"bytes_sent"`
	Rounds          uint64   `json:"rounds"`
	QEMUTotalMs     *float64 `json:"qemu_total_ms"`
	QEMUDowntimeMs  *float64 `json:"qemu_downtime_ms"`
	Scenario        string   `json:"scenario"`
	SameHost        bool     `json:"same_host"`

	QEMUDowntimeGuestMs         *float64 `json:"qemu_downtime_guest_ms"`
	QEMUAtTernBWBytesPerSec     *float64 `json:"qemu_at_tern_bw_bytes_per_sec"`
	QEMUAtTernBWTotalMs         *float64 `json:"qemu_at_tern_bw_total_ms"`
	QEMUAtTernBWDowntimeMs      *float64 `json:"qemu_at_tern_bw_downtime_ms"`
	QEMUAtTernBWDowntimeGuestMs *float64 `json:"qemu_at_tern_bw_downtime_guest_ms"`

	PauseBreakdown *apiv1.PauseBreakdown `json:"pause_breakdown"`
}

// MigrateReport is every scenario of one run, and why QEMU was skipped.
type MigrateReport struct {
	Scenarios   []MigrateScenario
	QEMUSkipped string
}

// Targets of the migration benchmark.
const (
	// TargetGuestDowntimeOverQEMU bounds the guest-measured downtime over
	// QEMU's at TargetRateMiBPerSec.
	TargetGuestDowntimeOverQEMU = 0.1
	// TargetRateMiBPerSec is the rate the downtime ratio is judged at.
	TargetRateMiBPerSec = 10
	// TargetSameHostDowntimeMs bounds the same-host path's downtime at
	// any size.
	TargetSameHostDowntimeMs = 5.0
)

// Bounds of the benchmark's waits.
const (
	guestSteadyWait   = 2 * time.Minute // boot, fill, first rate line
	migrateWait       = 10 * time.Minute
	afterMigrateWait  = 2 * time.Minute // the first verification after
	benchDirtyMemSkip = 8               // MiB of guest RAM not patterned
	benchWorkingSet   = 64              // MiB the guest rewrites
)

// RunMigrate runs every scenario: per size and rate, tern over QUIC, tern
// on the same host (memfds), and QEMU between two processes. It refuses
// to run inside the emulated test host and needs /dev/kvm.
func RunMigrate(ctx context.Context, opts MigrateOptions) (*MigrateReport, error) {
	if err := kvmhost.RefuseBenchmark(); err != nil {
		return nil, err
	}
	if err := kvm.Probe(); err != nil {
		return nil, fmt.Errorf("the migration benchmark needs a usable /dev/kvm: %w", err)
	}
	if opts.Tern == "" {
		return nil, fmt.Errorf("the migration benchmark: no tern binary")
	}
	if len(opts.SizesMiB) == 0 {
		opts.SizesMiB = []uint64{256, 1024}
	}
	if len(opts.RatesMiBPerSec) == 0 {
		opts.RatesMiBPerSec = []uint64{0, 10, 100}
	}
	for _, s := range opts.SizesMiB {
		if s < benchDirtyMemSkip+benchWorkingSet {
			return nil, fmt.Errorf("the migration benchmark: %d MiB is under the %d MiB it needs", s, benchDirtyMemSkip+benchWorkingSet)
		}
	}
	say := sayer(opts.Progress)
	dir, removeDir, err := workDir("", "tern-bench-migrate")
	if err != nil {
		return nil, err
	}
	defer removeDir()
	certs := filepath.Join(dir, "certs")
	if err := tlsconf.Generate(certs, nil, false); err != nil {
		return nil, fmt.Errorf("making certificates: %w", err)
	}
	rep := &MigrateReport{}
	qemu, qerr := lookQEMU()
	if qerr != nil {
		rep.QEMUSkipped = qerr.Error()
		say("%s", rep.QEMUSkipped)
	}
	for _, size := range opts.SizesMiB {
		for _, rate := range opts.RatesMiBPerSec {
			var rows []MigrateScenario
			var khz uint64
			for _, sameHost := range []bool{false, true} {
				name := map[bool]string{false: "quic", true: "same_host"}[sameHost]
				say("%d MiB at %d MiB/s: tern %s", size, rate, name)
				row, k, err := runTernMigration(ctx, opts.Tern, certs, dir, size, rate, sameHost)
				if err != nil {
					return nil, fmt.Errorf("%d MiB at %d MiB/s, %s: %w", size, rate, name, err)
				}
				row.Scenario, row.SameHost = name, sameHost
				rows, khz = append(rows, row), k
			}
			if qemu != "" {
				say("%d MiB at %d MiB/s: QEMU at its defaults", size, rate)
				q, err := runQEMUMigration(ctx, qemu, dir, size, rate, khz, 0)
				if err != nil {
					return nil, fmt.Errorf("%d MiB at %d MiB/s, QEMU: %w", size, rate, err)
				}
				// The rate tern's QUIC path reached: QEMU's limit set to it,
				// so "total ≤ QEMU's" is not QEMU's default cap.
				bw := float64(rows[0].BytesSent) / (rows[0].TotalMs / 1000)
				say("%d MiB at %d MiB/s: QEMU with max-bandwidth %.0f MiB/s", size, rate, bw/(1<<20))
				ql, err := runQEMUMigration(ctx, qemu, dir, size, rate, khz, uint64(bw))
				if err != nil {
					return nil, fmt.Errorf("%d MiB at %d MiB/s, QEMU with max-bandwidth %.0f B/s: %w", size, rate, bw, err)
				}
				for i := range rows {
					rows[i].QEMUTotalMs, rows[i].QEMUDowntimeMs, rows[i].QEMUDowntimeGuestMs = &q.totalMs, &q.downtimeMs, &q.guestGapMs
					rows[i].QEMUAtTernBWBytesPerSec = &bw
					rows[i].QEMUAtTernBWTotalMs, rows[i].QEMUAtTernBWDowntimeMs, rows[i].QEMUAtTernBWDowntimeGuestMs = &ql.totalMs, &ql.downtimeMs, &ql.guestGapMs
				}
			}
			rep.Scenarios = append(rep.Scenarios, rows...)
		}
	}
	return rep, nil
}

// dirtySpec is the benchmark's guest at size MiB dirtying rate MiB/s
// over benchWorkingSet MiB, verifying every second; at rate 0 it is the
// idle guest (the API's dirty_mib_per_sec 0 alone means unthrottled).
func dirtySpec(id string, size, rate uint64) apiv1.Spec {
	params := map[string]uint64{
		"mem_mib": size - benchDirtyMemSkip, "working_set_mib": benchWorkingSet,
		"dirty_mib_per_sec": rate, "verify_every_sec": 1,
	}
	if rate == 0 {
		params["idle"] = 1
	}
	return apiv1.Spec{ID: id, Name: "bench-migrate", VCPUs: 1, MemoryMiB: size,
		Guest: apiv1.GuestSpec{Kind: apiv1.GuestELF, Path: "dirty", Params: params},
		Disks: []apiv1.DiskSpec{}, Init: apiv1.InitSpec{Method: apiv1.InitSpecMethod}}
}

// runTernMigration boots the dirty guest in one `tern vmm serve`,
// migrates it to another with runner.Migrate (what `tern migrate` runs),
// and reads the guest's gaps off the target's console up to its first
// verification after the migration, which must pass. It also returns the
// guest's TSC frequency, for the QEMU run.
func runTernMigration(ctx context.Context, tern, certs, dir string, size, rate uint64, sameHost bool) (MigrateScenario, uint64, error) {
	row := MigrateScenario{MemoryMiB: size, DirtyMiBPerSec: rate}
	var procs []*vmmProc
	defer func() {
		for _, p := range procs {
			p.stop()
		}
	}()
	for _, name := range []string{"source", "target"} {
		p, err := startVMMProc(tern, certs, filepath.Join(dir, fmt.Sprintf("%s-%d-%d-%s.log", name, size, rate, map[bool]string{false: "quic", true: "samehost"}[sameHost])))
		if err != nil {
			return row, 0, err
		}
		procs = append(procs, p)
	}
	src, dst := procs[0].client, procs[1].client
	id := fmt.Sprintf("bench-%d-%d", size, rate)
	v, err := src.Ensure(ctx, dirtySpec(id, size, rate))
	if err != nil {
		return row, 0, fmt.Errorf("ensuring the source: %w", err)
	}
	if err := src.RequestState(ctx, apiv1.Run); err != nil {
		return row, 0, fmt.Errorf("running the source: %w", err)
	}
	if _, err := src.WaitFor(ctx, v.Gen, func(s apiv1.View) bool { return s.State == apiv1.Running }); err != nil {
		return row, 0, fmt.Errorf("waiting for the source to run: %w", err)
	}
	var khz uint64
	offset, _, err := readConsole(ctx, src, 0, guestSteadyWait, "the guest's first rate line", func(line string) bool {
		if n, ok := cutKHz(line); ok {
			khz = n
		}
		_, ok := guests.ParseDirtyRate(line)
		return ok
	})
	if err != nil {
		return row, 0, err
	}
	mctx, cancel := context.WithTimeout(ctx, migrateWait)
	r, err := runner.Migrate(mctx, src, dst, runner.MigrateOptions{SameHost: sameHost})
	cancel()
	if err != nil {
		return row, 0, err
	}
	row.TotalMs, row.DowntimeVMMMs, row.BytesSent, row.Rounds = r.TotalMs, r.DowntimeMs, r.BytesSent, r.Rounds
	row.PauseBreakdown = r.PauseBreakdown
	// The console up to here was printed before or during the migration;
	// the first verification after it must come later.
	finished, err := consoleEnd(ctx, dst, offset)
	if err != nil {
		return row, 0, err
	}
	var maxGap time.Duration
	var verify guests.DirtyVerify
	at := offset
	_, _, err = readConsole(ctx, dst, offset, afterMigrateWait, "the guest's first verification after the migration", func(line string) bool {
		at += uint64(len(line)) + 1
		if g, ok := dirtyGap(line); ok {
			maxGap = max(maxGap, g)
		}
		v, ok := guests.ParseDirtyVerify(line)
		verify = v
		return ok && at > finished
	})
	if err != nil {
		return row, 0, err
	}
	if !verify.Pass {
		return row, 0, fmt.Errorf("the guest's memory is wrong after the migration: verify FAIL %s", verify.Detail)
	}
	row.DowntimeGuestMs = ms(maxGap)
	return row, khz, procs[1].stopInstance(ctx, 0)
}

// consoleEnd returns the offset of the end of c's console now, reading
// its history from offset.
func consoleEnd(ctx context.Context, c *client.Client, offset uint64) (uint64, error) {
	for {
		h, err := c.SerialHistory(ctx, offset, apiv1.MaxSerialMaxBytes)
		if err != nil {
			return 0, fmt.Errorf("reading the target's console: %w", err)
		}
		if h.NextOffset == offset {
			return offset, nil
		}
		offset = h.NextOffset
	}
}

// dirtyGap reads either of the continuous dirty guest's gap lines: one
// over 1 ms as it happens, or an interval's largest, however short.
func dirtyGap(line string) (time.Duration, bool) {
	if g, ok := guests.ParseDirtyGap(line); ok {
		return g, true
	}
	return guests.ParseDirtyLargestGap(line)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// cutKHz reads N of the dirty guest's "dirty: tsc N kHz" line.
func cutKHz(line string) (uint64, bool) {
	rest, ok := strings.CutPrefix(line, "dirty: tsc ")
	if !ok {
		return 0, false
	}
	var n uint64
	_, err := fmt.Sscanf(rest, "%d kHz", &n)
	return n, err == nil
}

// readConsole reads c's console from offset, line by line, until match
// accepts a line; it returns the offset after that line. It gives up
// after wait, naming what it waited for.
func readConsole(ctx context.Context, c *client.Client, offset uint64, wait time.Duration, what string, match func(string) bool) (uint64, string, error) {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	conn, err := c.Serial(ctx, offset)
	if err != nil {
		return 0, "", fmt.Errorf("waiting for %s: %w", what, err)
	}
	defer conn.CloseNow()
	var pending []byte
	for {
		typ, msg, err := conn.Read(ctx)
		if err != nil {
			return 0, "", fmt.Errorf("waiting for %s (%v): %w", what, wait, err)
		}
		if typ != websocket.MessageBinary {
			continue
		}
		pending = append(pending, msg...)
		for {
			i := bytes.IndexByte(pending, '\n')
			if i < 0 {
				break
			}
			line := strings.TrimRight(string(pending[:i]), "\r")
			pending = pending[i+1:]
			offset += uint64(i + 1)
			if match(line) {
				return offset, line, nil
			}
		}
	}
}

// lookQEMU finds qemu-system-x86_64, or says why the QEMU peer is skipped.
func lookQEMU() (string, error) {
	path, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		return "", ErrNoQEMU
	}
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return "", fmt.Errorf("the QEMU peer was skipped: /dev/kvm: %w", err)
	}
	f.Close()
	return path, nil
}

// WriteTable prints every scenario, then each target beside its figure.
// Guest gaps are the dirty guest's own longest (µs resolution), printed
// with their value however short.
func (r *MigrateReport) WriteTable(w io.Writer) {
	fmt.Fprintf(w, "%-10s %6s %6s %10s %10s %10s %10s %6s | %10s %10s %10s | %10s %10s %10s %10s\n", "path", "MiB", "MiB/s",
		"total ms", "guest ms", "vmm ms", "MiB sent", "rounds", "qemu tot", "qemu down", "qemu guest",
		"bw MiB/s", "bw tot", "bw down", "bw guest")
	opt := func(p *float64, format string) string {
		if p == nil {
			return "-"
		}
		return fmt.Sprintf(format, *p)
	}
	for _, s := range r.Scenarios {
		var bwMiB *float64
		if s.QEMUAtTernBWBytesPerSec != nil {
			v := *s.QEMUAtTernBWBytesPerSec / (1 << 20)
			bwMiB = &v
		}
		fmt.Fprintf(w, "%-10s %6d %6d %10.1f %10.3f %10.1f %10.1f %6d | %10s %10s %10s | %10s %10s %10s %10s\n", s.Scenario, s.MemoryMiB, s.DirtyMiBPerSec,
			s.TotalMs, s.DowntimeGuestMs, s.DowntimeVMMMs, float64(s.BytesSent)/(1<<20), s.Rounds,
			opt(s.QEMUTotalMs, "%.1f"), opt(s.QEMUDowntimeMs, "%.1f"), opt(s.QEMUDowntimeGuestMs, "%.3f"),
			opt(bwMiB, "%.0f"), opt(s.QEMUAtTernBWTotalMs, "%.1f"), opt(s.QEMUAtTernBWDowntimeMs, "%.1f"), opt(s.QEMUAtTernBWDowntimeGuestMs, "%.3f"))
	}
	fmt.Fprintln(w, "guest ms: the dirty guest's longest progress gap from the migration's start to its first verification after; qemu: QEMU at its defaults (query-migrate's total and downtime, and the guest's gap read the same way); bw: QEMU with max-bandwidth set to the rate tern's QUIC migration reached")
	r.writeBreakdown(w)
	if r.QEMUSkipped != "" {
		fmt.Fprintf(w, "QEMU: %s\n", r.QEMUSkipped)
	}
	if g, ok := r.largestGuestGap(); ok {
		fmt.Fprintf(w, "largest guest gap: %.3f ms (%s, %d MiB at %d MiB/s)\n", g.DowntimeGuestMs, g.Scenario, g.MemoryMiB, g.DirtyMiBPerSec)
	}
	for _, s := range r.Scenarios {
		switch {
		case s.SameHost:
			fmt.Fprintf(w, "%d MiB at %d MiB/s, same host: guest downtime %.3f ms (target ≤ %.0f ms %s)\n", s.MemoryMiB, s.DirtyMiBPerSec,
				s.DowntimeGuestMs, TargetSameHostDowntimeMs, met(s.DowntimeGuestMs <= TargetSameHostDowntimeMs))
		case s.QEMUAtTernBWTotalMs != nil:
			line := fmt.Sprintf("%d MiB at %d MiB/s: total / QEMU's at the same bandwidth = %.2f (target ≤ 1 %s; / QEMU's at its defaults %.2f)",
				s.MemoryMiB, s.DirtyMiBPerSec, s.TotalMs / *s.QEMUAtTernBWTotalMs, met(s.TotalMs <= *s.QEMUAtTernBWTotalMs), s.TotalMs / *s.QEMUTotalMs)
			if s.DirtyMiBPerSec == TargetRateMiBPerSec {
				line += "; " + guestDowntimeRatio(s.DowntimeGuestMs, *s.QEMUAtTernBWDowntimeGuestMs, *s.QEMUDowntimeGuestMs)
			}
			fmt.Fprintln(w, line)
		}
	}
}

// writeBreakdown prints each row's pause breakdown in milliseconds and
// names its largest part.
func (r *MigrateReport) writeBreakdown(w io.Writer) {
	fmt.Fprintf(w, "\npause breakdown (ms, as the source measured it; restore and resume are the target's):\n")
	fmt.Fprintf(w, "%-10s %6s %6s %8s %8s | %7s %7s %7s %7s %7s %7s %7s %7s %7s %7s | %s\n", "path", "MiB", "MiB/s", "guest", "source",
		"stop", "quiesce", "flush", "harvest", "pages", "device", "restore", "finish", "resume", "other", "largest")
	for _, s := range r.Scenarios {
		b := s.PauseBreakdown
		if b == nil {
			fmt.Fprintf(w, "%-10s %6d %6d %8.3f %8s | none reported\n", s.Scenario, s.MemoryMiB, s.DirtyMiBPerSec, s.DowntimeGuestMs, "-")
			continue
		}
		name, us := largestPart(*b)
		msOf := func(us int64) float64 { return float64(us) / 1000 }
		fmt.Fprintf(w, "%-10s %6d %6d %8.3f %8.3f | %7.3f %7.3f %7.3f %7.3f %7.3f %7.3f %7.3f %7.3f %7.3f %7.3f | %s %.0f%%\n",
			s.Scenario, s.MemoryMiB, s.DirtyMiBPerSec, s.DowntimeGuestMs, msOf(b.TotalUs),
			msOf(b.StopUs), msOf(b.QuiesceUs), msOf(b.FlushUs), msOf(b.HarvestUs), msOf(b.LastPagesUs), msOf(b.DeviceStateUs),
			msOf(b.RestoreUs), msOf(b.FinishUs), msOf(b.ResumeUs), msOf(b.OtherUs), name, 100*float64(us)/float64(max(b.TotalUs, 1)))
	}
}

// largestPart names the breakdown's largest part (other included).
func largestPart(b apiv1.PauseBreakdown) (string, int64) {
	parts := []struct {
		name string
		us   int64
	}{{"stop", b.StopUs}, {"quiesce", b.QuiesceUs}, {"flush", b.FlushUs}, {"harvest", b.HarvestUs}, {"last pages", b.LastPagesUs},
		{"device state", b.DeviceStateUs}, {"restore", b.RestoreUs}, {"finish", b.FinishUs}, {"resume", b.ResumeUs}, {"other", b.OtherUs}}
	best := parts[0]
	for _, p := range parts[1:] {
		if p.us > best.us {
			best = p
		}
	}
	return best.name, best.us
}

// guestDowntimeRatio judges tern's guest-measured downtime against QEMU's,
// also guest-measured, at the same bandwidth (and shows it against QEMU's
// defaults beside).
func guestDowntimeRatio(tern, qemuLifted, qemuDefault float64) string {
	if qemuLifted <= 0 {
		return fmt.Sprintf("guest downtime %.3f ms, QEMU's at the same bandwidth %.3f ms: no ratio (target ≤ %.1f not judged)",
			tern, qemuLifted, TargetGuestDowntimeOverQEMU)
	}
	ratio := tern / qemuLifted
	s := fmt.Sprintf("guest downtime / QEMU's guest downtime at the same bandwidth = %.3f (target ≤ %.1f %s",
		ratio, TargetGuestDowntimeOverQEMU, met(ratio <= TargetGuestDowntimeOverQEMU))
	if qemuDefault > 0 {
		s += fmt.Sprintf("; / at its defaults %.3f", tern/qemuDefault)
	}
	return s + ")"
}

// largestGuestGap is the scenario with the longest guest-measured gap.
func (r *MigrateReport) largestGuestGap() (MigrateScenario, bool) {
	if len(r.Scenarios) == 0 {
		return MigrateScenario{}, false
	}
	best := r.Scenarios[0]
	for _, s := range r.Scenarios[1:] {
		if s.DowntimeGuestMs > best.DowntimeGuestMs {
			best = s
		}
	}
	return best, true
}

// JSON returns the rows `--json` writes.
func (r *MigrateReport) JSON() []MigrateScenario { return r.Scenarios }
