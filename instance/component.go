package instance

import (
	"bytes"
	"encoding/json"
	"fmt"

	"tern/instance/apiv1"
	"tern/migration"
)

// Component kinds.
const (
	// ComponentMigrationFailureInjector fails migrations on purpose:
	// {kind, fail_exports: N, fail_imports: N, phase: PHASE}
	// (migration.InjectorSpec); counts default to 0, phase to device.
	ComponentMigrationFailureInjector = "migration_failure_injector"
)

// componentKinds are the known component kinds, each with its parser.
var componentKinds = map[string]func(json.RawMessage) error{
	ComponentMigrationFailureInjector: func(raw json.RawMessage) error {
		_, err := parseInjector(raw)
		return err
	},
}

// parseInjector reads a migration_failure_injector strictly: no unknown
// fields, a phase of the protocol (not error), counts not negative.
func parseInjector(raw json.RawMessage) (migration.InjectorSpec, error) {
	var j struct {
		Kind string `json:"kind"`
		migration.InjectorSpec
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&j); err != nil {
		return migration.InjectorSpec{}, err
	}
	spec := j.InjectorSpec
	if spec.Phase == 0 {
		spec.Phase = apiv1.PhaseDevice // the default, as Propolis's
	}
	switch {
	case spec.Phase == apiv1.PhaseError:
		return spec, fmt.Errorf("phase: want one of %v", apiv1.Phases)
	case spec.FailExports < 0 || spec.FailImports < 0:
		return spec, fmt.Errorf("fail_exports %d, fail_imports %d: want 0 or more", spec.FailExports, spec.FailImports)
	}
	return spec, nil
}

// failureInjector returns the spec's migration_failure_injector, if it
// has one (Validate allows at most one). The spec must have passed
// Validate.
func failureInjector(s apiv1.Spec) (migration.InjectorSpec, bool) {
	for _, c := range s.Components {
		if c.Kind == ComponentMigrationFailureInjector {
			spec, err := parseInjector(c.Raw)
			return spec, err == nil
		}
	}
	return migration.InjectorSpec{}, false
}
