// Package serve holds what tern's server commands share around their
// handlers: the process logger from --log-level, serving an HTTP API until
// the command's context ends, and the HTTP client a server uses for its
// peers. Both binaries use it: tern (downstairs, vmm, agent) and
// tern-control, which runs `tern control` apart so that the etcd it embeds
// is linked into no other process.
package serve
