// Package agent is tern's host agent, one per host: it spawns and
// supervises the host's `tern vmm serve` processes (one per VM) and the
// `tern downstairs run` processes of its regions, reports its inventory,
// relays every vmm snapshot (with the vmm's own generation) to the
// control plane, and keeps the network mappings the control plane pushes.
//
// Invariants:
//   - A vmm process that dies is reported gone (at its last generation
//   - 1) and never restarted: what replaces it is the control plane's
//     decision.
//   - Ensuring a vmm or a region is idempotent: the same id returns what
//     exists.
//   - A vmm whose instance is destroyed has served its purpose: its
//     process is stopped, so a drained host runs no vmm.
//   - Each vmm's reports are relayed newest-first: the sender keeps only
//     the latest unsent report per vmm and retries until the control
//     plane takes it.
package agent
