// Package dataplane is reserved for the network data plane: the
// virtual-to-physical address mapping and packet path between the VMs of a
// rack. Nothing lives here yet.
//
// What every daemon shares (TLS configuration, telemetry, size parsing) is
// not the network data plane and lives under internal/ (internal/tlsconf,
// internal/telemetry, internal/units); docs/ARCHITECTURE.md says why.
package dataplane
