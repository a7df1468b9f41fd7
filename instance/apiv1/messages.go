package apiv1

// Version is GET /v1/version: what a migration peer must match.
type Version struct {
	// Build is tern's module version and VCS revision.
	Build string `json:"build"`
	// MigrationProtocols are the migration protocol versions spoken,
	// lowest first.
	MigrationProtocols []MigrationVersion `json:"migration_protocols"`
	// Devices maps each device state kind to the versions read.
	Devices map[string][]uint16 `json:"devices"`
}

// MigratedTo is the one text message a serial watcher of a migration
// source gets before its socket closes: the API URL of the VMM the
// instance runs on now.
type MigratedTo struct {
	URL string `json:"migrated_to"`
}

// StateRequest is the body of PUT /v1/instance/state.
type StateRequest struct {
	Requested Request `json:"requested"`
}

// SerialHistory is GET /v1/instance/serial/history: the console's bytes
// from FromOffset (later than asked when older bytes were dropped) to
// NextOffset, as text with invalid UTF-8 replaced.
type SerialHistory struct {
	Data       string `json:"data"`
	FromOffset uint64 `json:"from_offset"`
	NextOffset uint64 `json:"next_offset"`
}

// Error is every error's body. State is set for wrong_state; Problems
// lists each problem of an invalid spec.
type Error struct {
	ErrorCode string   `json:"error_code"`
	Message   string   `json:"message"`
	State     *State   `json:"state,omitempty"`
	Problems  []string `json:"problems,omitempty"`
}

// Error codes.
const (
	CodeMalformed     = "malformed_request"
	CodeInvalidSpec   = "invalid_spec"
	CodeBodyTooLarge  = "body_too_large"
	CodeNoInstance    = "no_instance"
	CodeInstanceGone  = "instance_gone"
	CodeConflict      = "instance_exists"
	CodeSpecMismatch  = "spec_mismatch"
	CodeWrongState    = "wrong_state"
	CodeNotFound      = "not_found"
	CodeNoSuchDisk    = "no_such_disk"
	CodeMethod        = "method_not_allowed"
	CodeOffsetAhead   = "offset_ahead"
	CodeShuttingDown  = "shutting_down"
	CodeInternalError = "internal_error"
)

// MaxBodyBytes bounds every request body.
const MaxBodyBytes = 1 << 20

// Serial history limits.
const (
	DefaultSerialMaxBytes = 64 << 10
	MaxSerialMaxBytes     = 1 << 20
)
