package instance

import (
	"errors"
	"fmt"
	"strings"

	"tern/instance/apiv1"
)

// Pending is the set of requests the policy has enqueued and the driver has
// not yet completed: queued, or being carried out. A migration in progress
// is part of it (MigrateOut on the source, MigrateIn on the target), so the
// policy sees it as input and returns it as output instead of keeping a
// side flag.
//
// Only Decide adds a request and only Completed removes one. The driver
// calls Completed exactly once for every enqueued request when it ends —
// succeeded, failed, or dropped because a stop superseded it — so a failed
// migration handshake cannot leave MigrateOut set (the second gap in the
// Propolis notes).
type Pending uint8

// None is the empty Pending set.
const None Pending = 0

// PendingOf returns the set holding reqs.
func PendingOf(reqs ...apiv1.Request) Pending {
	var p Pending
	for _, r := range reqs {
		p = p.with(r)
	}
	return p
}

// Has reports whether r is pending.
func (p Pending) Has(r apiv1.Request) bool { return p&(1<<r) != 0 }

func (p Pending) with(r apiv1.Request) Pending { return p | 1<<r }

// Completed returns p without r. The driver calls it when r ends, whatever
// the outcome.
func (p Pending) Completed(r apiv1.Request) Pending { return p &^ (1 << r) }

// String lists the pending requests joined by "+", or "none".
func (p Pending) String() string {
	var names []string
	for _, r := range apiv1.AllRequests() {
		if p.Has(r) {
			names = append(names, r.String())
		}
	}
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, "+")
}

// Consistent reports whether a driver that follows the Pending contract can
// be in state s with p pending. Decide answers for every pair, but the
// driver's tests assert Consistent after every transition:
//   - creating, starting: only run and stop can be pending;
//   - running, rebooting: stop, plus at most one of reboot and migrate_out
//     (each is denied while the other is pending); a guest-initiated reset
//     can put a rebooting instance under a queued migrate_out;
//   - migrating: exactly one of migrate_out and migrate_in, and maybe stop;
//   - stopping: at most the stop being carried out (the driver completes
//     everything else when it starts halting);
//   - stopped, failed, destroyed: nothing.
func Consistent(s apiv1.State, p Pending) bool {
	only := func(allowed ...apiv1.Request) bool { return p&^PendingOf(allowed...) == 0 }
	switch s {
	case apiv1.Creating, apiv1.Starting:
		return only(apiv1.Run, apiv1.Stop)
	case apiv1.Running, apiv1.Rebooting:
		return only(apiv1.Stop, apiv1.Reboot, apiv1.MigrateOut) && !(p.Has(apiv1.Reboot) && p.Has(apiv1.MigrateOut))
	case apiv1.Migrating:
		return only(apiv1.Stop, apiv1.MigrateOut, apiv1.MigrateIn) && p.Has(apiv1.MigrateOut) != p.Has(apiv1.MigrateIn)
	case apiv1.Stopping:
		return only(apiv1.Stop)
	case apiv1.Stopped, apiv1.Failed, apiv1.Destroyed:
		return p == None
	}
	return false
}

// Disposition is what the policy does with a request.
type Disposition uint8

// The dispositions. The API answers 204 to Enqueue and Ignore and 409
// wrong_state to Deny.
const (
	// Enqueue hands the request to the instance's goroutine and adds it to
	// Pending.
	Enqueue Disposition = iota + 1
	// Ignore drops the request because what it asks for is already true or
	// already pending.
	Ignore
	// Deny refuses the request; Decision.Reason says why.
	Deny
)

var dispositionNames = [...]string{Enqueue: "enqueue", Ignore: "ignore", Deny: "deny"}

// String returns "enqueue", "ignore" or "deny".
func (d Disposition) String() string {
	return enumString(dispositionNames[:], uint8(d), "Disposition")
}

// Reason says why a request was denied.
type Reason uint8

// The deny reasons. The zero Reason goes with Enqueue and Ignore.
const (
	// ReasonNotStarted: reboot or migrate_out before the instance has run.
	ReasonNotStarted Reason = iota + 1
	// ReasonNotMigrationTarget: migrate_in to an instance that was not
	// ensured as a migration target.
	ReasonNotMigrationTarget
	// ReasonRebooting: migrate_out while a reboot is pending or in progress.
	ReasonRebooting
	// ReasonMigrating: reboot or migrate_out while a migration is pending or
	// in progress.
	ReasonMigrating
	// ReasonStopping: anything but stop once a stop is pending or the
	// instance is halting.
	ReasonStopping
	// ReasonHalted: anything but stop after the instance stopped or was
	// destroyed.
	ReasonHalted
	// ReasonFailed: anything but stop after the instance failed.
	ReasonFailed
)

var reasonCodes = [...]string{
	ReasonNotStarted:         "not_started",
	ReasonNotMigrationTarget: "not_migration_target",
	ReasonRebooting:          "rebooting",
	ReasonMigrating:          "migrating",
	ReasonStopping:           "stopping",
	ReasonHalted:             "halted",
	ReasonFailed:             "failed",
}

var reasonMessages = [...]string{
	ReasonNotStarted:         "the instance has not started running yet",
	ReasonNotMigrationTarget: "the instance was not created as a migration target",
	ReasonRebooting:          "a reboot is in progress",
	ReasonMigrating:          "a migration is in progress",
	ReasonStopping:           "the instance is stopping",
	ReasonHalted:             "the instance has halted; ensure a new instance",
	ReasonFailed:             "the instance has failed; ensure a new instance",
}

// String returns the reason's short code ("not_started").
func (r Reason) String() string { return enumString(reasonCodes[:], uint8(r), "Reason") }

// Message returns the reason as a sentence for the API's message field.
func (r Reason) Message() string {
	if int(r) < len(reasonMessages) && reasonMessages[r] != "" {
		return reasonMessages[r]
	}
	return r.String()
}

// Decision is the policy's answer to one request.
type Decision struct {
	Disposition Disposition
	Reason      Reason // set only for Deny
}

var (
	enqueue = Decision{Disposition: Enqueue}
	ignore  = Decision{Disposition: Ignore}
)

func deny(r Reason) Decision { return Decision{Disposition: Deny, Reason: r} }

// String returns "enqueue", "ignore" or "deny(reason)".
func (d Decision) String() string {
	if d.Disposition == Deny {
		return fmt.Sprintf("deny(%s)", d.Reason)
	}
	return d.Disposition.String()
}

// Err returns nil unless d denies req, and then a *WrongStateError for
// state s.
func (d Decision) Err(s apiv1.State, req apiv1.Request) error {
	if d.Disposition != Deny {
		return nil
	}
	return &WrongStateError{State: s, Request: req, Reason: d.Reason}
}

// ErrWrongState is what every denied request's error matches with
// errors.Is. The API maps it to 409 {"error_code":"wrong_state", ...}.
var ErrWrongState = errors.New("wrong state for request")

// WrongStateError is a denied request. The API answers
// 409 {"error_code":"wrong_state","message":Error(),"state":State}.
type WrongStateError struct {
	State   apiv1.State
	Request apiv1.Request
	Reason  Reason
}

// Error reads like "reboot denied while starting: the instance has not
// started running yet".
func (e *WrongStateError) Error() string {
	return fmt.Sprintf("%s denied while %s: %s", e.Request, e.State, e.Reason.Message())
}

// Is makes errors.Is(err, ErrWrongState) true.
func (e *WrongStateError) Is(target error) bool { return target == ErrWrongState }

// situation is a State refined by what is pending: the rows of the policy
// table. Two (state, pending) pairs in the same situation get the same
// answer to every request.
type situation uint8

const (
	sitCreated      situation = iota // creating/starting, no run pending
	sitRunPending                    // creating/starting, run pending
	sitRunning                       // running, nothing pending
	sitRebooting                     // rebooting, or running with reboot pending
	sitMigratingOut                  // a migration out pending or in progress
	sitMigratingIn                   // a migration in in progress
	sitStopping                      // stopping, or a live state with stop pending
	sitHalted                        // stopped or destroyed
	sitFailed                        // failed
	numSituations
)

// policy is THE request policy: the only place that says which request is
// legal in which situation. Its rows, as State × Request with nothing else
// pending (E enqueue, I ignore, D(reason) deny):
//
//	state     | run         | stop | reboot         | migrate_out    | migrate_in
//	----------+-------------+------+----------------+----------------+-----------------------
//	creating  | E           | E    | D(not_started) | D(not_started) | D(not_migration_target)
//	starting  | E           | E    | D(not_started) | D(not_started) | D(not_migration_target)
//	running   | I           | E    | E              | E              | D(not_migration_target)
//	rebooting | I           | E    | I              | D(rebooting)   | D(not_migration_target)
//	migrating | I           | E    | D(migrating)   | D(migrating)   | I on the target, else D(not_migration_target)
//	stopping  | D(stopping) | I    | D(stopping)    | D(stopping)    | D(stopping)
//	stopped   | D(halted)   | I    | D(halted)      | D(halted)      | D(halted)
//	destroyed | D(halted)   | I    | D(halted)      | D(halted)      | D(halted)
//	failed    | D(failed)   | I    | D(failed)      | D(failed)      | D(failed)
//
// What is pending refines the row (see situationOf): a pending stop makes
// any live state answer like stopping (stop itself is ignored); a pending
// migration answers like migrating; a pending reboot answers like
// rebooting; a pending run makes a second run an Ignore.
//
// Why each choice:
//   - run while creating/starting is enqueued: the vCPUs start as soon as
//     activation finishes; the caller need not poll for readiness (seed 000).
//     A repeated run is ignored, not queued twice.
//   - stop is enqueued in every live state and aborts creation or
//     activation; the controller is destroyed. Stop is never denied: while
//     stopping, stopped, destroyed or failed the instance is already not
//     running, so it is ignored and a retrying orchestrator never sees 409.
//   - reboot, migrate_out and migrate_in while creating/starting are denied:
//     there is no running guest to reset or move. Propolis accepts a
//     migrate-out while a start is pending and then treats it as
//     unreachable (its first gap); here the row denies it.
//   - reboot while rebooting (or with a reboot pending) is ignored, not
//     queued: no guest code runs between the accepted reboot and the next
//     Running, so a second reset would restart a guest that never ran, and
//     clients that retry a reboot would otherwise cause reboot loops.
//   - migrate_out while a reboot is pending or in progress is denied, and
//     reboot while a migration is pending or in progress is denied: a
//     migration starts from, and returns to, a quiet running guest; the
//     source must never export device state mid-reset.
//   - run while migrating is ignored: the guest runs throughout pre-copy,
//     and when the migration ends it runs on one side or the other.
//   - stop while migrating is enqueued: the driver handles it when the
//     migration settles (after success the source is already stopping;
//     after failure it has resumed and now stops; on a target it aborts the
//     import).
//   - migrate_in is never enqueued: a migration target is born at (migrating,
//     {migrate_in}) by its ensure. A repeat of that ensure reaching the
//     policy (the API has already checked that id and spec match) is
//     ignored; on any other instance it is denied.
//   - nothing is ever enqueued in stopping, stopped, destroyed or failed,
//     so nothing revives a halted instance; only a new ensure (a new
//     instance and a new publisher) follows destroyed.
var policy = [numSituations][apiv1.MigrateIn + 1]Decision{
	sitCreated: {
		apiv1.Run: enqueue, apiv1.Stop: enqueue,
		apiv1.Reboot: deny(ReasonNotStarted), apiv1.MigrateOut: deny(ReasonNotStarted), apiv1.MigrateIn: deny(ReasonNotMigrationTarget),
	},
	sitRunPending: {
		apiv1.Run: ignore, apiv1.Stop: enqueue,
		apiv1.Reboot: deny(ReasonNotStarted), apiv1.MigrateOut: deny(ReasonNotStarted), apiv1.MigrateIn: deny(ReasonNotMigrationTarget),
	},
	sitRunning: {
		apiv1.Run: ignore, apiv1.Stop: enqueue,
		apiv1.Reboot: enqueue, apiv1.MigrateOut: enqueue, apiv1.MigrateIn: deny(ReasonNotMigrationTarget),
	},
	sitRebooting: {
		apiv1.Run: ignore, apiv1.Stop: enqueue,
		apiv1.Reboot: ignore, apiv1.MigrateOut: deny(ReasonRebooting), apiv1.MigrateIn: deny(ReasonNotMigrationTarget),
	},
	sitMigratingOut: {
		apiv1.Run: ignore, apiv1.Stop: enqueue,
		apiv1.Reboot: deny(ReasonMigrating), apiv1.MigrateOut: deny(ReasonMigrating), apiv1.MigrateIn: deny(ReasonNotMigrationTarget),
	},
	sitMigratingIn: {
		apiv1.Run: ignore, apiv1.Stop: enqueue,
		apiv1.Reboot: deny(ReasonMigrating), apiv1.MigrateOut: deny(ReasonMigrating), apiv1.MigrateIn: ignore,
	},
	sitStopping: {
		apiv1.Run: deny(ReasonStopping), apiv1.Stop: ignore,
		apiv1.Reboot: deny(ReasonStopping), apiv1.MigrateOut: deny(ReasonStopping), apiv1.MigrateIn: deny(ReasonStopping),
	},
	sitHalted: {
		apiv1.Run: deny(ReasonHalted), apiv1.Stop: ignore,
		apiv1.Reboot: deny(ReasonHalted), apiv1.MigrateOut: deny(ReasonHalted), apiv1.MigrateIn: deny(ReasonHalted),
	},
	sitFailed: {
		apiv1.Run: deny(ReasonFailed), apiv1.Stop: ignore,
		apiv1.Reboot: deny(ReasonFailed), apiv1.MigrateOut: deny(ReasonFailed), apiv1.MigrateIn: deny(ReasonFailed),
	},
}

// situationOf picks the policy row for (s, p). Precedence, first match wins:
// the halted states by state alone; a pending stop; a pending migration
// (in, then out; a migrating state with neither pending is treated as a
// source, the more restrictive row); a reboot pending or in progress; then
// the state. It returns false for an invalid state.
func situationOf(s apiv1.State, p Pending) (situation, bool) {
	switch s {
	case apiv1.Stopping:
		return sitStopping, true
	case apiv1.Stopped, apiv1.Destroyed:
		return sitHalted, true
	case apiv1.Failed:
		return sitFailed, true
	case apiv1.Creating, apiv1.Starting, apiv1.Running, apiv1.Rebooting, apiv1.Migrating:
	default:
		return 0, false
	}
	switch {
	case p.Has(apiv1.Stop):
		return sitStopping, true
	case p.Has(apiv1.MigrateIn):
		return sitMigratingIn, true
	case p.Has(apiv1.MigrateOut) || s == apiv1.Migrating:
		return sitMigratingOut, true
	case p.Has(apiv1.Reboot) || s == apiv1.Rebooting:
		return sitRebooting, true
	case s == apiv1.Running:
		return sitRunning, true
	case p.Has(apiv1.Run):
		return sitRunPending, true
	}
	return sitCreated, true
}

// Decide judges req against an instance in state s with p pending and
// returns the decision and the new pending set: p plus req when the
// decision is Enqueue, p unchanged otherwise (a denied or ignored request
// never sets a flag). It is pure: the API calls it under the instance's
// lock, applies the result, and hands enqueued requests to the instance's
// goroutine.
//
// An invalid state or request is denied with ReasonHalted rather than
// panicking, since the request comes from the network.
func Decide(s apiv1.State, p Pending, req apiv1.Request) (Decision, Pending) {
	sit, ok := situationOf(s, p)
	if !ok || req < apiv1.Run || req > apiv1.MigrateIn {
		return deny(ReasonHalted), p
	}
	d := policy[sit][req]
	if d.Disposition == Enqueue {
		p = p.with(req)
	}
	return d, p
}

// enumString maps a small enum to its name in a table indexed by value
// (index 0 unused).
func enumString(names []string, v uint8, typ string) string {
	if int(v) < len(names) && names[v] != "" {
		return names[v]
	}
	return fmt.Sprintf("%s(%d)", typ, v)
}
