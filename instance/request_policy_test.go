package instance

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"tern/instance/apiv1"
)

// expectedPolicy is written by hand, independently of the policy table: one
// line for every (state, pending) pair a driver following the Pending
// contract can reach, and the answer to each request. Cells: E enqueue, I
// ignore, or a deny reason code. Pending is "-" or requests joined by "+".
const expectedPolicy = `
# state     pending              run                   stop  reboot       migrate_out  migrate_in
creating    -                    E                     E     not_started  not_started  not_migration_target
creating    run                  I                     E     not_started  not_started  not_migration_target
creating    stop                 stopping              I     stopping     stopping     stopping
creating    run+stop             stopping              I     stopping     stopping     stopping
starting    -                    E                     E     not_started  not_started  not_migration_target
starting    run                  I                     E     not_started  not_started  not_migration_target
starting    stop                 stopping              I     stopping     stopping     stopping
starting    run+stop             stopping              I     stopping     stopping     stopping
running     -                    I                     E     E            E            not_migration_target
running     reboot               I                     E     I            rebooting    not_migration_target
running     migrate_out          I                     E     migrating    migrating    not_migration_target
running     stop                 stopping              I     stopping     stopping     stopping
running     stop+reboot          stopping              I     stopping     stopping     stopping
running     stop+migrate_out     stopping              I     stopping     stopping     stopping
rebooting   -                    I                     E     I            rebooting    not_migration_target
rebooting   reboot               I                     E     I            rebooting    not_migration_target
rebooting   migrate_out          I                     E     migrating    migrating    not_migration_target
rebooting   stop                 stopping              I     stopping     stopping     stopping
rebooting   stop+reboot          stopping              I     stopping     stopping     stopping
rebooting   stop+migrate_out     stopping              I     stopping     stopping     stopping
migrating   migrate_out          I                     E     migrating    migrating    not_migration_target
migrating   migrate_in           I                     E     migrating    migrating    I
migrating   stop+migrate_out     stopping              I     stopping     stopping     stopping
migrating   stop+migrate_in      stopping              I     stopping     stopping     stopping
stopping    -                    stopping              I     stopping     stopping     stopping
stopping    stop                 stopping              I     stopping     stopping     stopping
stopped     -                    halted                I     halted       halted       halted
destroyed   -                    halted                I     halted       halted       halted
failed      -                    failed                I     failed       failed       failed
`

type policyCase struct {
	state   apiv1.State
	pending Pending
	req     apiv1.Request
	want    Decision
	line    int
}

func parseExpectedPolicy(t *testing.T) []policyCase {
	t.Helper()
	reasons := map[string]Reason{}
	for r := ReasonNotStarted; r <= ReasonFailed; r++ {
		reasons[r.String()] = r
	}
	var cases []policyCase
	for i, line := range strings.Split(expectedPolicy, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		if len(f) != 2+len(apiv1.AllRequests()) {
			t.Fatalf("line %d: %d fields: %q", i, len(f), line)
		}
		var s apiv1.State
		if err := s.UnmarshalText([]byte(f[0])); err != nil {
			t.Fatalf("line %d: %v", i, err)
		}
		var p Pending
		if f[1] != "-" {
			for name := range strings.SplitSeq(f[1], "+") {
				var r apiv1.Request
				if err := r.UnmarshalText([]byte(name)); err != nil {
					t.Fatalf("line %d: %v", i, err)
				}
				p = p.with(r)
			}
		}
		for j, req := range apiv1.AllRequests() {
			var want Decision
			switch cell := f[2+j]; cell {
			case "E":
				want = enqueue
			case "I":
				want = ignore
			default:
				r, ok := reasons[cell]
				if !ok {
					t.Fatalf("line %d: unknown cell %q", i, cell)
				}
				want = deny(r)
			}
			cases = append(cases, policyCase{s, p, req, want, i})
		}
	}
	return cases
}

// allPendings is every value of Pending the five request bits can form.
func allPendings() []Pending {
	var ps []Pending
	for bits := 0; bits < 1<<len(apiv1.AllRequests()); bits++ {
		var p Pending
		for i, r := range apiv1.AllRequests() {
			if bits&(1<<i) != 0 {
				p = p.with(r)
			}
		}
		ps = append(ps, p)
	}
	return ps
}

func TestDecideMatchesHandWrittenTableForEveryReachableInput(t *testing.T) {
	cases := parseExpectedPolicy(t)
	seen := map[[2]uint8]bool{}
	for _, c := range cases {
		seen[[2]uint8{uint8(c.state), uint8(c.pending)}] = true
		got, gotPending := Decide(c.state, c.pending, c.req)
		wantPending := c.pending
		if c.want.Disposition == Enqueue {
			wantPending = c.pending.with(c.req)
		}
		if got != c.want || gotPending != wantPending {
			t.Errorf("line %d: Decide(%s, %s, %s) = %s, %s; want %s, %s",
				c.line, c.state, c.pending, c.req, got, gotPending, c.want, wantPending)
		}
	}
	// The hand-written table and Consistent must name the same pairs: no
	// reachable pair is left untested and no listed pair is unreachable.
	for _, s := range apiv1.AllStates() {
		for _, p := range allPendings() {
			listed := seen[[2]uint8{uint8(s), uint8(p)}]
			if listed != Consistent(s, p) {
				t.Errorf("(%s, %s): listed in expected table %v, Consistent %v", s, p, listed, Consistent(s, p))
			}
		}
	}
	if want := 29 * len(apiv1.AllRequests()); len(cases) != want {
		t.Errorf("expected table has %d cases, want %d", len(cases), want)
	}
}

// forEveryInput runs f on every state × pending × request, reachable or not.
func forEveryInput(f func(s apiv1.State, p Pending, r apiv1.Request)) {
	for _, s := range apiv1.AllStates() {
		for _, p := range allPendings() {
			for _, r := range apiv1.AllRequests() {
				f(s, p, r)
			}
		}
	}
}

func TestDenyAndIgnoreNeverChangePending(t *testing.T) {
	forEveryInput(func(s apiv1.State, p Pending, r apiv1.Request) {
		d, next := Decide(s, p, r)
		switch d.Disposition {
		case Deny, Ignore:
			if next != p {
				t.Errorf("Decide(%s, %s, %s) = %s changed pending to %s", s, p, r, d, next)
			}
			if next.Has(apiv1.MigrateOut) && !p.Has(apiv1.MigrateOut) || next.Has(apiv1.MigrateIn) && !p.Has(apiv1.MigrateIn) {
				t.Errorf("Decide(%s, %s, %s) = %s left a migration pending", s, p, r, d)
			}
		case Enqueue:
			if p.Has(r) || next != p.with(r) {
				t.Errorf("Decide(%s, %s, %s) enqueued: pending %s -> %s; want only %s added, once", s, p, r, p, next, r)
			}
		default:
			t.Errorf("Decide(%s, %s, %s) = invalid decision %+v", s, p, r, d)
		}
		if (d.Disposition == Deny) != (d.Reason != 0) {
			t.Errorf("Decide(%s, %s, %s) = %+v: a reason goes with deny and only deny", s, p, r, d)
		}
	})
}

func TestHaltedStatesAcceptNothingThatRevivesThem(t *testing.T) {
	forEveryInput(func(s apiv1.State, p Pending, r apiv1.Request) {
		if !s.Terminal() && s != apiv1.Stopping {
			return
		}
		d, _ := Decide(s, p, r)
		want := Deny
		if r == apiv1.Stop {
			want = Ignore
		}
		if d.Disposition != want {
			t.Errorf("Decide(%s, %s, %s) = %s; want %s", s, p, r, d, want)
		}
	})
}

func TestPendingStopDeniesEverythingButStop(t *testing.T) {
	forEveryInput(func(s apiv1.State, p Pending, r apiv1.Request) {
		if !p.Has(apiv1.Stop) {
			return
		}
		d, _ := Decide(s, p, r)
		if d.Disposition == Enqueue {
			t.Errorf("Decide(%s, %s, %s) = %s; nothing is enqueued behind a stop", s, p, r, d)
		}
	})
}

// Propolis gap (a): a migrate request accepted while the start is pending.
func TestMigrateIsDeniedWhileCreatingOrStarting(t *testing.T) {
	for _, s := range []apiv1.State{apiv1.Creating, apiv1.Starting} {
		for _, p := range allPendings() {
			if !Consistent(s, p) {
				continue
			}
			for _, r := range []apiv1.Request{apiv1.MigrateOut, apiv1.MigrateIn, apiv1.Reboot} {
				d, next := Decide(s, p, r)
				if d.Disposition != Deny || next != p {
					t.Errorf("Decide(%s, %s, %s) = %s, %s; want deny, pending unchanged", s, p, r, d, next)
				}
				if err := d.Err(s, r); !errors.Is(err, ErrWrongState) {
					t.Errorf("Decide(%s, %s, %s).Err = %v; want ErrWrongState", s, p, r, err)
				}
			}
		}
	}
}

func TestRunAndStopAreAcceptedDuringCreation(t *testing.T) {
	for _, s := range []apiv1.State{apiv1.Creating, apiv1.Starting} {
		d, p := Decide(s, None, apiv1.Run)
		if d.Disposition != Enqueue || p != PendingOf(apiv1.Run) {
			t.Fatalf("run while %s: %s, %s", s, d, p)
		}
		if d, p2 := Decide(s, p, apiv1.Run); d.Disposition != Ignore || p2 != p {
			t.Fatalf("second run while %s: %s, %s; want ignore", s, d, p2)
		}
		d, p = Decide(s, p, apiv1.Stop)
		if d.Disposition != Enqueue || !p.Has(apiv1.Stop) {
			t.Fatalf("stop while %s with run pending: %s, %s", s, d, p)
		}
	}
}

// Propolis gap (b): a failed migration handshake left awaiting_migration_out
// set, so the source refused every later migration.
func TestFailedMigrationHandshakeLeavesNothingPending(t *testing.T) {
	d, p := Decide(apiv1.Running, None, apiv1.MigrateOut)
	if d.Disposition != Enqueue || !p.Has(apiv1.MigrateOut) {
		t.Fatalf("migrate_out while running: %s, %s", d, p)
	}
	if d, _ := Decide(apiv1.Running, p, apiv1.MigrateOut); d != deny(ReasonMigrating) {
		t.Fatalf("second migrate_out while one is pending: %s; want deny(migrating)", d)
	}
	// The handshake fails before the state ever becomes migrating; the
	// driver completes the request like any other.
	p = p.Completed(apiv1.MigrateOut)
	if p != None {
		t.Fatalf("after the failed handshake pending = %s; want none", p)
	}
	if d, _ := Decide(apiv1.Running, p, apiv1.MigrateOut); d.Disposition != Enqueue {
		t.Fatalf("migrate_out after a failed one: %s; want enqueue", d)
	}
	if d, _ := Decide(apiv1.Running, p, apiv1.Reboot); d.Disposition != Enqueue {
		t.Fatalf("reboot after a failed migration: %s; want enqueue", d)
	}
	for _, q := range allPendings() {
		for _, r := range apiv1.AllRequests() {
			if got := q.Completed(r); got.Has(r) || got != q&^PendingOf(r) {
				t.Errorf("%s.Completed(%s) = %s", q, r, got)
			}
		}
	}
}

func TestRebootWhileRebootingIsIgnored(t *testing.T) {
	for _, tc := range []struct {
		s apiv1.State
		p Pending
	}{{apiv1.Rebooting, None}, {apiv1.Rebooting, PendingOf(apiv1.Reboot)}, {apiv1.Running, PendingOf(apiv1.Reboot)}} {
		if d, next := Decide(tc.s, tc.p, apiv1.Reboot); d.Disposition != Ignore || next != tc.p {
			t.Errorf("reboot in (%s, %s): %s, %s; want ignore", tc.s, tc.p, d, next)
		}
	}
}

func TestEveryReachableInputStaysConsistentAfterDecide(t *testing.T) {
	forEveryInput(func(s apiv1.State, p Pending, r apiv1.Request) {
		if !Consistent(s, p) {
			return
		}
		if d, next := Decide(s, p, r); !Consistent(s, next) {
			t.Errorf("Decide(%s, %s, %s) = %s, %s: inconsistent", s, p, r, d, next)
		}
	})
}

func TestDeniedRequestErrorCarriesStateForTheAPI(t *testing.T) {
	d, _ := Decide(apiv1.Starting, None, apiv1.Reboot)
	err := d.Err(apiv1.Starting, apiv1.Reboot)
	if !errors.Is(err, ErrWrongState) {
		t.Fatalf("err = %v; want ErrWrongState", err)
	}
	var ws *WrongStateError
	if !errors.As(fmt.Errorf("handling request: %w", err), &ws) {
		t.Fatalf("errors.As failed on %v", err)
	}
	if ws.State != apiv1.Starting || ws.Request != apiv1.Reboot || ws.Reason != ReasonNotStarted {
		t.Fatalf("WrongStateError = %+v", ws)
	}
	if want := "reboot denied while starting: the instance has not started running yet"; err.Error() != want {
		t.Fatalf("Error() = %q; want %q", err.Error(), want)
	}
	if err := ignore.Err(apiv1.Running, apiv1.Run); err != nil {
		t.Fatalf("ignore.Err = %v; want nil", err)
	}
	if err := enqueue.Err(apiv1.Running, apiv1.Stop); err != nil {
		t.Fatalf("enqueue.Err = %v; want nil", err)
	}
}

func TestInvalidInputIsDeniedNotPanicking(t *testing.T) {
	if d, p := Decide(apiv1.State(0), None, apiv1.Run); d.Disposition != Deny || p != None {
		t.Errorf("invalid state: %s, %s", d, p)
	}
	if d, p := Decide(apiv1.Running, None, apiv1.Request(99)); d.Disposition != Deny || p != None {
		t.Errorf("invalid request: %s, %s", d, p)
	}
	if Consistent(apiv1.State(0), None) {
		t.Error("Consistent(invalid state) = true")
	}
}

func TestNamesRoundTripThroughText(t *testing.T) {
	for _, s := range apiv1.AllStates() {
		b, err := s.MarshalText()
		if err != nil {
			t.Fatal(err)
		}
		var got apiv1.State
		if err := got.UnmarshalText(b); err != nil || got != s {
			t.Errorf("state %q round trip: %v, %v", b, got, err)
		}
	}
	for _, r := range apiv1.AllRequests() {
		b, err := r.MarshalText()
		if err != nil {
			t.Fatal(err)
		}
		var got apiv1.Request
		if err := got.UnmarshalText(b); err != nil || got != r {
			t.Errorf("request %q round trip: %v, %v", b, got, err)
		}
	}
	if _, err := apiv1.State(0).MarshalText(); err == nil {
		t.Error("zero State marshaled")
	}
	var r apiv1.Request
	if err := r.UnmarshalText([]byte("Run")); err == nil {
		t.Error(`request "Run" parsed; names are lower case`)
	}
	for reason := ReasonNotStarted; reason <= ReasonFailed; reason++ {
		if reason.Message() == "" || strings.HasPrefix(reason.String(), "Reason(") {
			t.Errorf("reason %d lacks a code or message", reason)
		}
	}
}
