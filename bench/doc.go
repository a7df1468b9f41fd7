// Package bench holds the scenarios behind `tern bench`. Every scenario
// measures tern beside the limit that bounds it, in the same run on the
// same machine (a local file for storage IO, one bare QUIC stream for the
// network path), and reports ratios: the machines are shared and noisy, so
// only a ratio measured in one run means anything.
//
// Scenarios print a table for people and write JSON for plots and
// regression checks. Timing lives here and in testing.B benchmarks, never
// in pass/fail tests.
package bench
