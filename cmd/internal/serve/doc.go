// Package serve holds what tern's binaries share around their commands:
// the process logger from --log-level, serving an HTTP API until the
// command's context ends, the HTTP client a server uses for its peers,
// the build version and the migration-protocol test hook, and the tern
// binary a sibling binary (tern-agent, tern-bench) starts its children
// from. tern, tern-control, tern-agent and tern-bench all link it, so it
// links nothing heavier than TLS and the instance contract.
package serve
