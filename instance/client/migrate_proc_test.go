package client_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"syscall"
	"testing"

	"github.com/coder/websocket"

	"tern/instance/apiv1"
	"tern/instance/client"
	"tern/vmm/guests"
	"tern/vmm/kvm/kvmtest"
)

// The migration tests run two or three real `tern vmm serve` processes
// sharing one CA and drive them over HTTP: the source runs the dirty
// guest, a target is ensured with init migration_target, and every wait
// is on a published generation or a console line.

// dirtyMigrationSpec is the dirty guest at memMiB, rewriting workingMiB
// continuously and verifying its whole pattern every second. Inside the
// emulated test host, where a page crosses QUIC at well under 1 MiB/s, it
// is 16 MiB with 2 MiB patterned (what the first round sends) and at most
// 1 MiB rewritten: these tests check what a migration does, not its rate.
func dirtyMigrationSpec(id string, memMiB, workingMiB, mibPerSec uint64) apiv1.Spec {
	patternMiB := memMiB - 8
	if kvmtest.Inside() {
		memMiB, patternMiB, workingMiB = 16, 2, min(workingMiB, 1)
	}
	return apiv1.Spec{ID: id, Name: "dirty", VCPUs: 1, MemoryMiB: memMiB,
		Guest: apiv1.GuestSpec{Kind: apiv1.GuestELF, Path: "dirty", Params: map[string]uint64{
			"mem_mib": patternMiB, "working_set_mib": workingMiB, "dirty_mib_per_sec": mibPerSec, "verify_every_sec": 1}},
		Init: apiv1.InitSpec{Method: apiv1.InitSpecMethod}}
}

// targetSpec is a migration target's ensure of the source's instance id.
func targetSpec(id, source, migrationID string) apiv1.Spec {
	return apiv1.Spec{ID: id, Init: apiv1.InitSpec{Method: apiv1.InitMigrationTarget, Source: source, MigrationID: migrationID}}
}

// consoleWatch follows one process's serial websocket line by line.
type consoleWatch struct {
	conn *websocket.Conn
	part string
	seen []string
	// text is the first text message, when one came.
	text string
}

func watchConsole(t *testing.T, c *client.Client, from uint64) *consoleWatch {
	t.Helper()
	conn, err := c.Serial(ctx(t), from)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.CloseNow() })
	return &consoleWatch{conn: conn}
}

// next returns the next whole line; a text message or the socket's end
// is an error.
func (w *consoleWatch) next(ctx context.Context) (string, error) {
	for {
		if i := strings.IndexByte(w.part, '\n'); i >= 0 {
			line := strings.TrimRight(w.part[:i], "\r")
			w.part = w.part[i+1:]
			w.seen = append(w.seen, line)
			return line, nil
		}
		typ, msg, err := w.conn.Read(ctx)
		if err != nil {
			return "", err
		}
		if typ == websocket.MessageText {
			w.text = string(msg)
			return "", fmt.Errorf("text message %q", msg)
		}
		w.part += string(msg)
	}
}

// waitVerifyPass waits for the dirty guest's next verification, which
// must pass.
func (w *consoleWatch) waitVerifyPass(t *testing.T, what string) guests.DirtyVerify {
	t.Helper()
	c := ctx(t)
	for {
		line, err := w.next(c)
		if err != nil {
			t.Fatalf("waiting for a dirty verification %s: %v (console %q)", what, err, w.seen)
		}
		if v, ok := guests.ParseDirtyVerify(line); ok {
			if !v.Pass {
				t.Fatalf("dirty guest %s: %s", what, line)
			}
			return v
		}
	}
}

// verifiesOn waits for a dirty verification p's guest makes from now on.
func verifiesOn(t *testing.T, p *vmmProc, what string) {
	t.Helper()
	h, err := p.client.SerialHistory(ctx(t), 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	watchConsole(t, p.client, h.NextOffset).waitVerifyPass(t, what)
}

// runDirty ensures and runs the dirty guest on p and waits for its first
// verification.
func runDirty(t *testing.T, p *vmmProc, spec apiv1.Spec) {
	t.Helper()
	c := ctx(t)
	if _, err := p.client.Ensure(c, spec); err != nil {
		t.Fatal(err)
	}
	if err := p.client.RequestState(c, apiv1.Run); err != nil {
		t.Fatal(err)
	}
	watchConsole(t, p.client, 0).waitVerifyPass(t, "on the source")
}

// history records every snapshot a wait sees and checks gens strictly
// increase.
type history struct {
	t     *testing.T
	name  string
	snaps []apiv1.View
}

func (h *history) waitFor(c *client.Client, what string, done func(apiv1.View) bool) apiv1.View {
	h.t.Helper()
	var after apiv1.ViewGen
	if n := len(h.snaps); n > 0 {
		after = h.snaps[n-1].Gen
	}
	wctx, cancel := context.WithTimeout(h.t.Context(), kvmtest.Sized(generous, 4*generous)) // a Linux guest's migration in the emulated host
	defer cancel()
	snap, err := c.WaitFor(wctx, after, func(s apiv1.View) bool {
		if n := len(h.snaps); n > 0 {
			last := h.snaps[n-1]
			switch {
			case s.Gen < last.Gen:
				h.t.Errorf("%s: gen %d after gen %d", h.name, s.Gen, last.Gen)
			case s.Gen == last.Gen:
				// The long-poll's 30 s passed with nothing new: the same
				// snapshot again, which must not have changed.
				if s != last {
					h.t.Errorf("%s: gen %d published twice: %+v and %+v", h.name, s.Gen, last, s)
				}
				return false
			}
		}
		h.snaps = append(h.snaps, s)
		return done(s)
	})
	if err != nil {
		h.t.Fatalf("%s: waiting for %s: %v (seen %+v)", h.name, what, err, h.snaps)
	}
	return snap
}

func migrationAddr(t *testing.T, p *vmmProc) string {
	t.Helper()
	v, err := p.client.Get(ctx(t))
	if err != nil || v.MigrationAddr == "" {
		t.Fatalf("GET /v1/instance: %+v, %v; want a migration_addr", v, err)
	}
	return v.MigrationAddr
}

// migrateOK migrates the running instance from src to a fresh target
// ensured with spec, and checks both ends: the source destroyed at out
// phase finish, the target running at in phase finish, gens strictly
// increasing on both, and the dirty guest verifying its whole pattern on
// the target.
func migrateOK(t *testing.T, src, dst *vmmProc, spec apiv1.Spec, srcSeen *history) {
	t.Helper()
	migrateAndCheck(t, src, dst, spec, srcSeen, func(w *consoleWatch) string {
		v := w.waitVerifyPass(t, "on the target")
		return fmt.Sprintf("target verified generation %d", v.Generation)
	})
}

// migrateAndCheck is migrateOK with the check of the target's console
// after the migration given: onTarget reads it from the first byte the
// target printed and returns what it saw, for the log.
func migrateAndCheck(t *testing.T, src, dst *vmmProc, spec apiv1.Spec, srcSeen *history, onTarget func(*consoleWatch) string) {
	t.Helper()
	// A Linux guest's hundreds of MiB take minutes in the emulated host.
	c, cancel := context.WithTimeout(t.Context(), kvmtest.Sized(generous, 4*generous))
	defer cancel()
	watcher := watchConsole(t, src.client, 0)
	if v, err := dst.client.Ensure(c, spec); err != nil || v.State != apiv1.Migrating || v.Migration.In.ID != spec.Init.MigrationID {
		t.Fatalf("ensuring the target: %+v, %v; want migrating with in.id %s", v, err, spec.Init.MigrationID)
	}
	dstSeen := &history{t: t, name: "target"}
	in := dstSeen.waitFor(dst.client, "running", func(s apiv1.View) bool {
		return s.State == apiv1.Running || s.State == apiv1.Failed || s.State == apiv1.Destroyed
	}).Migration.In
	if last := dstSeen.snaps[len(dstSeen.snaps)-1]; last.State != apiv1.Running || in.Phase != apiv1.PhaseFinish || in.TotalMs <= 0 {
		v, _ := dst.client.Get(c)
		t.Fatalf("target ended %s with in %+v; want running at finish (error %q)", last.State, in, v.Error)
	}
	out := srcSeen.waitFor(src.client, "destroyed", func(s apiv1.View) bool {
		return s.State == apiv1.Destroyed
	}).Migration.Out
	if out.Phase != apiv1.PhaseFinish || out.ID != spec.Init.MigrationID || out.TotalMs <= 0 || out.DowntimeMs <= 0 || out.Round < 1 && !spec.Init.SameHost {
		t.Fatalf("source's out at destroyed: %+v; want finish of %s with totals", out, spec.Init.MigrationID)
	}
	// The source's serial watcher is sent to the target.
	for {
		if _, err := watcher.next(c); err != nil {
			break
		}
	}
	var to apiv1.MigratedTo
	if err := json.Unmarshal([]byte(watcher.text), &to); err != nil || to.URL != dst.url {
		t.Fatalf("source's serial watcher got %q; want {\"migrated_to\":%q}", watcher.text, dst.url)
	}
	if _, _, err := watcher.conn.Read(c); websocket.CloseStatus(err) != websocket.StatusNormalClosure {
		t.Fatalf("after migrated_to the socket ended with %v; want a normal close", err)
	}
	// The target's console continues the source's, and the guest goes
	// on there.
	end, err := src.client.SerialHistory(c, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	h, err := dst.client.SerialHistory(c, 0, apiv1.MaxSerialMaxBytes)
	if err != nil || h.NextOffset < end.NextOffset {
		t.Fatalf("target console ends at %d (%v); want it to continue the source's, which ends at %d", h.NextOffset, err, end.NextOffset)
	}
	saw := onTarget(watchConsole(t, dst.client, h.NextOffset))
	t.Logf("migrated %s: rounds %d, %d bytes, total %.0f ms, downtime %.1f ms; %s",
		spec.Init.MigrationID, out.Round, out.BytesSent, out.TotalMs, out.DowntimeMs, saw)
}

// TestMigrateDirtyGuestBetweenTwoProcesses moves a running dirty guest
// from one vmm process to another over QUIC with mutual TLS.
func TestMigrateDirtyGuestBetweenTwoProcesses(t *testing.T) {
	src := startVMM(t, "")
	dst := startVMM(t, src.certs)
	runDirty(t, src, dirtyMigrationSpec("mig", 64, 4, 64))
	migrateOK(t, src, dst, targetSpec("mig", migrationAddr(t, src), "m-1"), &history{t: t, name: "source"})
}

// TestMigrateSameHostHandsTheMemoryOver uses the memfd path between two
// processes: no page is sent.
func TestMigrateSameHostHandsTheMemoryOver(t *testing.T) {
	src := startVMM(t, "")
	dst := startVMM(t, src.certs)
	runDirty(t, src, dirtyMigrationSpec("mig", 64, 4, 64))
	spec := targetSpec("mig", migrationAddr(t, src), "m-same")
	spec.Init.SameHost = true
	srcSeen := &history{t: t, name: "source"}
	migrateOK(t, src, dst, spec, srcSeen)
	if out := srcSeen.snaps[len(srcSeen.snaps)-1].Migration.Out; out.BytesSent != 0 {
		t.Fatalf("same-host migration sent %d page bytes; want none", out.BytesSent)
	}
}

// waitSourceResumed waits for the source's running + out.phase error,
// which must come in one generation, and returns it.
func waitSourceResumed(t *testing.T, seen *history, src *vmmProc, id string) apiv1.View {
	t.Helper()
	snap := seen.waitFor(src.client, "running with out.phase error", func(s apiv1.View) bool {
		return s.Migration.Out.Phase == apiv1.PhaseError || s.State == apiv1.Destroyed || s.State == apiv1.Failed
	})
	if snap.State != apiv1.Running || snap.Migration.Out.ID != id || snap.Migration.Out.Error == "" {
		t.Fatalf("source at out.phase error: %+v; want state running in the same gen, out.id %s and a reason", snap, id)
	}
	return snap
}

// waitTargetFailed waits for the target to end failed at in.phase error
// and returns its error.
func waitTargetFailed(t *testing.T, dst *vmmProc) string {
	t.Helper()
	seen := &history{t: t, name: "target"}
	snap := seen.waitFor(dst.client, "failed", func(s apiv1.View) bool {
		return s.State == apiv1.Failed || s.State == apiv1.Running || s.State == apiv1.Destroyed
	})
	for _, s := range seen.snaps {
		if s.State == apiv1.Running {
			t.Fatalf("the target ran: %+v", seen.snaps)
		}
	}
	if snap.State != apiv1.Failed || snap.Migration.In.Phase != apiv1.PhaseError || snap.Migration.In.Error == "" {
		t.Fatalf("target ended %+v; want failed at in.phase error with a reason", snap)
	}
	return snap.Migration.In.Error
}

// TestMigrationImportFailureResumesTheSourceThenASecondTargetSucceeds
// mirrors Propolis's import_failure: a target whose failure injector
// fails its import ends failed; the source publishes running with
// out.phase error in one generation; at once the same source migrates to
// a second target, and the guest verifies its whole memory there.
func TestMigrationImportFailureResumesTheSourceThenASecondTargetSucceeds(t *testing.T) {
	src := startVMM(t, "")
	bad := startVMM(t, src.certs)
	good := startVMM(t, src.certs)
	runDirty(t, src, dirtyMigrationSpec("mig", 64, 4, 64))
	addr := migrationAddr(t, src)
	spec := targetSpec("mig", addr, "m-fail")
	var inj apiv1.ComponentSpec
	if err := json.Unmarshal([]byte(`{"kind":"migration_failure_injector","fail_imports":1}`), &inj); err != nil {
		t.Fatal(err)
	}
	spec.Components = map[string]apiv1.ComponentSpec{"inj": inj}
	if _, err := bad.client.Ensure(ctx(t), spec); err != nil {
		t.Fatal(err)
	}
	srcSeen := &history{t: t, name: "source"}
	waitSourceResumed(t, srcSeen, src, "m-fail")
	if reason := waitTargetFailed(t, bad); !strings.Contains(reason, "inject") {
		t.Errorf("target's reason %q; want the injected failure named", reason)
	}
	// No wait: the generation that showed the error is enough.
	migrateOK(t, src, good, targetSpec("mig", addr, "m-ok"), srcSeen)
}

// TestMigrationVersionMismatchFailsCleanlyOnBothSides: a target that
// offers only protocol 99 (the test hook) is refused; the source runs on
// and reports the error, the target fails naming the versions.
func TestMigrationVersionMismatchFailsCleanlyOnBothSides(t *testing.T) {
	src := startVMM(t, "")
	dst := startVMMEnv(t, src.certs, []string{"TERN_MIGRATION_PROTOCOLS=99"})
	if v, err := dst.client.Version(ctx(t)); err != nil || len(v.MigrationProtocols) != 1 || v.MigrationProtocols[0] != 99 {
		t.Fatalf("the hooked target's version: %+v, %v; want protocols [99]", v, err)
	}
	runDirty(t, src, dirtyMigrationSpec("mig", 64, 4, 64))
	if _, err := dst.client.Ensure(ctx(t), targetSpec("mig", migrationAddr(t, src), "m-ver")); err != nil {
		t.Fatal(err)
	}
	srcSeen := &history{t: t, name: "source"}
	snap := waitSourceResumed(t, srcSeen, src, "m-ver")
	if !strings.Contains(snap.Migration.Out.Error, "99") {
		t.Errorf("source's reason %q; want the versions named", snap.Migration.Out.Error)
	}
	if reason := waitTargetFailed(t, dst); !strings.Contains(reason, "99") || !strings.Contains(reason, "version") {
		t.Errorf("target's reason %q; want the versions named", reason)
	}
	verifiesOn(t, src, "on the source after the refused migration")
}

// slowToConverge is a target ensure whose source cannot meet its
// downtime target: pre-copy runs rounds to the round limit, which leaves
// time to kill a process while ram_push is published.
func slowToConverge(id, addr, migrationID string) apiv1.Spec {
	s := targetSpec(id, addr, migrationID)
	one := uint64(1)
	s.Init.DowntimeTargetMs = &one
	return s
}

// TestKillingTheTargetDuringPreCopyResumesTheSource: SIGKILL of the
// target while the source publishes ram_push; the source resumes and
// reports error, and its guest verifies on.
func TestKillingTheTargetDuringPreCopyResumesTheSource(t *testing.T) {
	src := startVMM(t, "")
	dst := startVMM(t, src.certs)
	runDirty(t, src, dirtyMigrationSpec("mig", 64, 32, 1024))
	if _, err := dst.client.Ensure(ctx(t), slowToConverge("mig", migrationAddr(t, src), "m-kill-dst")); err != nil {
		t.Fatal(err)
	}
	srcSeen := &history{t: t, name: "source"}
	srcSeen.waitFor(src.client, "out.phase ram_push", func(s apiv1.View) bool {
		return s.Migration.Out.Phase == apiv1.PhaseRAMPush || s.Migration.Out.Phase == apiv1.PhaseError
	})
	if err := dst.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	dst.termOnce.Do(func() { <-dst.exited })
	waitSourceResumed(t, srcSeen, src, "m-kill-dst")
	verifiesOn(t, src, "on the source after its target died")
}

// TestKillingTheSourceDuringPreCopyFailsTheTarget: SIGKILL of the source
// while the target publishes ram_push; the target ends failed and never
// runs.
func TestKillingTheSourceDuringPreCopyFailsTheTarget(t *testing.T) {
	src := startVMM(t, "")
	dst := startVMM(t, src.certs)
	runDirty(t, src, dirtyMigrationSpec("mig", 64, 32, 1024))
	if _, err := dst.client.Ensure(ctx(t), slowToConverge("mig", migrationAddr(t, src), "m-kill-src")); err != nil {
		t.Fatal(err)
	}
	dstSeen := &history{t: t, name: "target"}
	dstSeen.waitFor(dst.client, "in.phase ram_push", func(s apiv1.View) bool {
		return s.Migration.In.Phase == apiv1.PhaseRAMPush || s.State != apiv1.Migrating
	})
	if err := src.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	src.termOnce.Do(func() { <-src.exited })
	waitTargetFailed(t, dst)
}

// TestMigrationDeniedByTheSourcesPolicyFailsTheTargetWithTheReason: a
// source with no instance, then one that has not started, refuse the
// connection; the target reports why, and the source is untouched.
func TestMigrationDeniedByTheSourcesPolicyFailsTheTargetWithTheReason(t *testing.T) {
	src := startVMM(t, "")
	first := startVMM(t, src.certs)
	second := startVMM(t, src.certs)
	// migration_addr is reported only with an instance; the listener is
	// there before it.
	if _, err := src.client.Ensure(ctx(t), echoSpec("mig")); err != nil {
		t.Fatal(err)
	}
	addr := migrationAddr(t, src)
	if _, err := first.client.Ensure(ctx(t), targetSpec("mig", addr, "m-early")); err != nil {
		t.Fatal(err)
	}
	if reason := waitTargetFailed(t, first); !strings.Contains(reason, "migrate_out denied while creating") {
		t.Errorf("target's reason %q; want the source's policy's", reason)
	}
	if v, err := src.client.Get(ctx(t)); err != nil || v.State != apiv1.Creating || v.Migration.Out.Active() {
		t.Fatalf("source after the refusal: %+v, %v; want creating with no migration", v, err)
	}
	// Another instance id than the source's is refused by the target.
	if err := src.client.RequestState(ctx(t), apiv1.Run); err != nil {
		t.Fatal(err)
	}
	(&history{t: t, name: "source"}).waitFor(src.client, "running", func(s apiv1.View) bool { return s.State == apiv1.Running })
	if _, err := second.client.Ensure(ctx(t), targetSpec("other", addr, "m-id")); err != nil {
		t.Fatal(err)
	}
	if reason := waitTargetFailed(t, second); !strings.Contains(reason, `the source's instance is "mig"`) {
		t.Errorf("target's reason %q; want the instance ids named", reason)
	}
}

// TestStoppingAMigrationTargetAbandonsTheImport: a stop requested of a
// target during pre-copy ends it destroyed with in.phase error, its guest
// never run; the source resumes and reports the error.
func TestStoppingAMigrationTargetAbandonsTheImport(t *testing.T) {
	src := startVMM(t, "")
	dst := startVMM(t, src.certs)
	runDirty(t, src, dirtyMigrationSpec("mig", 64, 32, 1024))
	if _, err := dst.client.Ensure(ctx(t), slowToConverge("mig", migrationAddr(t, src), "m-stop")); err != nil {
		t.Fatal(err)
	}
	dstSeen := &history{t: t, name: "target"}
	dstSeen.waitFor(dst.client, "in.phase ram_push", func(s apiv1.View) bool {
		return s.Migration.In.Phase == apiv1.PhaseRAMPush || s.State != apiv1.Migrating
	})
	if err := dst.client.RequestState(ctx(t), apiv1.Stop); err != nil {
		t.Fatal(err)
	}
	end := dstSeen.waitFor(dst.client, "destroyed", func(s apiv1.View) bool {
		return s.State == apiv1.Destroyed || s.State == apiv1.Failed
	})
	for _, s := range dstSeen.snaps {
		if s.State == apiv1.Running {
			t.Fatalf("the target ran: %+v", dstSeen.snaps)
		}
	}
	if end.State != apiv1.Destroyed || end.Migration.In.Phase != apiv1.PhaseError {
		t.Fatalf("target ended %+v; want destroyed with in.phase error", end)
	}
	waitSourceResumed(t, &history{t: t, name: "source"}, src, "m-stop")
	verifiesOn(t, src, "on the source after its target stopped")
}
