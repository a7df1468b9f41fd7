// Package telemetry holds what every tern daemon shares for observability:
// a structured JSON logger with a component attribute per subsystem, and an
// HTTP endpoint exposing a VictoriaMetrics metrics set in Prometheus text
// format at /metrics.
//
// It lives under internal/ because every daemon of this module uses it and
// nothing outside the module should (docs/ARCHITECTURE.md).
package telemetry
