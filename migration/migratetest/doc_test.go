// Package migratetest holds the black-box tests of `tern migrate` and of
// `tern instance serial` following a migration: they build tern, run two
// `tern vmm serve` processes and the CLI as a user would, with a real
// dirty guest, here or inside the emulated test host (kvmtest). They
// live apart from cmd/tern's own tests so that only they enter the
// emulated host.
package migratetest
