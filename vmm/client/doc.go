// Package client is the Go client of the vmm control API (package api),
// used by `tern instance` and the tests. Every non-2xx answer becomes an
// *APIError carrying the server's error_code, so callers branch with
// errors.As or IsCode instead of parsing messages.
//
// Migrate drives a live migration between two servers (what `tern
// migrate` and `tern bench migrate` run): CheckMigrationVersions on both
// GET /v1/version, the target's migration_target ensure, then both
// monitors until the target runs and the source is destroyed, or either
// fails (*MigrationError). The decision over what the monitors said is a
// pure function of the snapshots seen (migrationWatch.decide).
package client
