// Package layering holds the test that keeps tern's package layering as
// docs/ARCHITECTURE.md draws it: the rules are one table in
// layering_test.go, checked against the import graph `go list` reports for
// the whole module. The package has no code of its own.
package layering
