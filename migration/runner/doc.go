// Package runner drives a live migration between two tern VMMs through
// their control APIs, as `tern migrate`, the benchmarks and a control
// plane do: it compares their versions (CheckMigrationVersions), ensures
// the target as a migration target of the source, and follows both
// monitors until the target runs and the source is destroyed, or either
// side reports a failure (*MigrationError), or neither publishes anything
// for StallTimeout. Printer shows its events as tern migrate prints them.
//
// The migration itself (the protocol and the source and target engines)
// runs inside the two VMMs (package migration, driven by instance);
// the runner only starts it and watches what they publish
// (migration.Progress in each instance's monitor).
package runner
