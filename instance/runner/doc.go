// Package runner drives a live migration between two tern VMMs through
// their control APIs, as `tern migrate`, the benchmarks and a control
// plane do: it compares their versions (CheckMigrationVersions), ensures
// the target as a migration target of the source, and follows both
// monitors until the target runs and the source is destroyed, or either
// side reports a failure (*MigrationError), or neither publishes anything
// for StallTimeout. (tern migrate prints its events; cmd/tern owns that
// printer, so the runner links no terminal code.)
//
// The migration itself (the protocol and the source and target engines)
// runs inside the two VMMs (package migration, driven by instance);
// the runner only starts it and watches what they publish
// (apiv1.Progress in each instance's published view). It links the
// instance client and contract only, never the engines or the VMM.
package runner
