// Package inspect looks at the replicas of a volume without taking it over:
// it opens read-only sessions (which never activate and so never fence the
// active upstairs), reads each replica's region geometry and extent
// versions, and reports how many extents disagree. It is what
// `tern volume status` prints.
//
// An unreachable replica is a finding, not an error; so is disagreement.
// Probe fails only when no replica answered at all.
package inspect
