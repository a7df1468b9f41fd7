package migration

import (
	"errors"
	"fmt"
	"sync/atomic"

	"tern/instance/apiv1"
)

// Errors a caller branches on; test with errors.Is.
var (
	// ErrNoCommonVersion: the two sides speak no protocol version in
	// common.
	ErrNoCommonVersion = errors.New("no common migration protocol version")
	// ErrUnknownDevice: a device payload of a kind or version this tern
	// does not read.
	ErrUnknownDevice = errors.New("unknown device state")
	// ErrInjected: the failure injector failed the migration on purpose.
	ErrInjected = errors.New("migration failure injected")
	// ErrIncompatible: the target cannot host the source's VM as sent.
	ErrIncompatible = errors.New("incompatible migration peer")
	// ErrCommitted wraps a failure after the point of no return: the
	// source's guest is the target's now and the source never resumes it.
	ErrCommitted = errors.New("failed after the point of no return")
)

// RemoteError is a failure the peer reported.
type RemoteError struct {
	Code    uint16
	Message string
}

func (e *RemoteError) Error() string { return "peer: " + e.Message }

// Unwrap maps the code to this package's sentinel, if any.
func (e *RemoteError) Unwrap() error { return sentinelOf(e.Code) }

func sentinelOf(code uint16) error {
	switch code {
	case codeNoCommonVersion:
		return ErrNoCommonVersion
	case codeUnknownDevice:
		return ErrUnknownDevice
	case codeInjected:
		return ErrInjected
	case codeIncompatible:
		return ErrIncompatible
	}
	return nil
}

// codeOf is the wire code of err.
func codeOf(err error) uint16 {
	for _, c := range []uint16{codeNoCommonVersion, codeUnknownDevice, codeInjected, codeIncompatible} {
		if errors.Is(err, sentinelOf(c)) {
			return c
		}
	}
	return codeInternal
}

// InjectorSpec is the migration_failure_injector component: at Phase, the
// next FailExports migrations out and FailImports migrations in fail.
type InjectorSpec struct {
	Phase       apiv1.Phase `json:"phase"`
	FailExports int         `json:"fail_exports"`
	FailImports int         `json:"fail_imports"`
}

// Injector fails migrations on purpose, as its spec says. A nil Injector
// injects nothing. Safe for concurrent use; it counts across migrations.
type Injector struct {
	// Immutable after NewInjector.
	phase apiv1.Phase
	// exports and imports are the failures left to inject.
	exports, imports atomic.Int64
}

// NewInjector returns an injector for spec.
func NewInjector(spec InjectorSpec) *Injector {
	i := &Injector{phase: spec.Phase}
	i.exports.Store(int64(spec.FailExports))
	i.imports.Store(int64(spec.FailImports))
	return i
}

// fail returns ErrInjected, consuming one failure of left, when p is the
// injector's phase and failures are left.
func (i *Injector) fail(p apiv1.Phase, left *atomic.Int64, side string) error {
	if i == nil || p != i.phase {
		return nil
	}
	for {
		n := left.Load()
		if n <= 0 {
			return nil
		}
		if left.CompareAndSwap(n, n-1) {
			return fmt.Errorf("%s at %v: %w", side, p, ErrInjected)
		}
	}
}

func (i *Injector) failExport(p apiv1.Phase) error {
	if i == nil {
		return nil
	}
	return i.fail(p, &i.exports, "exporting")
}

func (i *Injector) failImport(p apiv1.Phase) error {
	if i == nil {
		return nil
	}
	return i.fail(p, &i.imports, "importing")
}
