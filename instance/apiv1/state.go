package apiv1

import "fmt"

// State is the published lifecycle state of an instance (DESIGN §5).
type State uint8

// The instance states. The zero value is not a state, so a View or
// decision input that was never filled in fails loudly instead of reading
// as "creating".
const (
	// Creating: ensure has returned; memory, devices and volume activation
	// are being set up on the instance's goroutine. No vCPU has run.
	Creating State = iota + 1
	// Starting: objects exist and the instance is finishing activation and
	// starting its vCPUs. Still no guest code has run.
	Starting
	// Running: vCPUs run the guest.
	Running
	// Rebooting: devices and vCPUs are being reset; the guest runs again
	// (Running) when that is done.
	Rebooting
	// Stopping: the instance is halting; it goes on to Stopped, then
	// Destroyed once every resource is freed.
	Stopping
	// Stopped: vCPUs are halted for good; the controller is being torn down.
	Stopped
	// Migrating: the instance is a migration source or target; which one is
	// among the controller's pending requests (migrate_out or migrate_in).
	Migrating
	// Failed: start, migration-in or the VM itself failed. Terminal.
	Failed
	// Destroyed: every goroutine, fd, connection and guest page is gone.
	// Terminal; only a new ensure (a new instance) follows it.
	Destroyed
)

var stateNames = [...]string{
	Creating:  "creating",
	Starting:  "starting",
	Running:   "running",
	Rebooting: "rebooting",
	Stopping:  "stopping",
	Stopped:   "stopped",
	Migrating: "migrating",
	Failed:    "failed",
	Destroyed: "destroyed",
}

// AllStates lists every State, in declaration order.
func AllStates() []State {
	return []State{Creating, Starting, Running, Rebooting, Stopping, Stopped, Migrating, Failed, Destroyed}
}

// String returns the state's API name, or "State(N)" for an invalid value.
func (s State) String() string { return enumString(stateNames[:], uint8(s), "State") }

// MarshalText returns the state's API name ("running"); it fails for an
// invalid value rather than publishing one.
func (s State) MarshalText() ([]byte, error) { return enumMarshal(stateNames[:], uint8(s), "state") }

// UnmarshalText parses an API name such as "running".
func (s *State) UnmarshalText(text []byte) error {
	v, err := enumParse(stateNames[:], text, "state")
	*s = State(v)
	return err
}

// Terminal reports whether nothing can follow s but a new instance: the
// policy never enqueues a request in a terminal state.
func (s State) Terminal() bool { return s == Stopped || s == Failed || s == Destroyed }

// Request is a state change asked of an instance through the API (run,
// stop, reboot) or by migration (migrate_out on the source when a target
// connects; migrate_in is the target's own ensure).
type Request uint8

// The requests.
const (
	Run Request = iota + 1
	Stop
	Reboot
	MigrateOut
	MigrateIn
)

var requestNames = [...]string{
	Run:        "run",
	Stop:       "stop",
	Reboot:     "reboot",
	MigrateOut: "migrate_out",
	MigrateIn:  "migrate_in",
}

// AllRequests lists every Request, in declaration order.
func AllRequests() []Request { return []Request{Run, Stop, Reboot, MigrateOut, MigrateIn} }

// String returns the request's API name, or "Request(N)" for an invalid value.
func (r Request) String() string { return enumString(requestNames[:], uint8(r), "Request") }

// MarshalText returns the request's API name ("reboot").
func (r Request) MarshalText() ([]byte, error) {
	return enumMarshal(requestNames[:], uint8(r), "request")
}

// UnmarshalText parses an API name such as "reboot"; the API answers 400 on
// its error.
func (r *Request) UnmarshalText(text []byte) error {
	v, err := enumParse(requestNames[:], text, "request")
	*r = Request(v)
	return err
}

// enumString, enumMarshal and enumParse map small enums to the names in a
// table indexed by value (index 0 unused).
func enumString(names []string, v uint8, typ string) string {
	if int(v) < len(names) && names[v] != "" {
		return names[v]
	}
	return fmt.Sprintf("%s(%d)", typ, v)
}

func enumMarshal(names []string, v uint8, what string) ([]byte, error) {
	if int(v) < len(names) && names[v] != "" {
		return []byte(names[v]), nil
	}
	return nil, fmt.Errorf("marshaling %s: invalid value %d", what, v)
}

func enumParse(names []string, text []byte, what string) (uint8, error) {
	for i, n := range names {
		if n != "" && n == string(text) {
			return uint8(i), nil
		}
	}
	return 0, fmt.Errorf("parsing %s: unknown name %q", what, text)
}
