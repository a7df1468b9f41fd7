// Package apiv1 is the contract of the instance service's HTTP API
// (`tern vmm serve`, package instance/api) as plain Go values: what a
// client sends (Spec and its parts, StateRequest), what it reads back
// (Instance, the published View and its ViewGen, DiskStatus, Version,
// SerialHistory), the lifecycle States and Requests, the migration
// Phase and Progress the engines publish, and every error body (Error)
// and error_code.
//
// It owns no behaviour beyond encoding, strict decoding (DecodeSpec) and
// arithmetic on its own values: validating a spec against a host, the
// request policy and the publisher stay in package instance, beside the
// controller that drives them.
//
// Invariants:
//   - It imports the standard library and tern/volume/ids only, so a
//     client (instance/client, instance/runner, the agent, the control
//     plane) links the contract and not the VMM, the migration engines or
//     the volume (internal/layering enforces this).
//   - The JSON keys are the API's and are checked by outside tests: a
//     Go name may change, a key may not.
//   - ViewGen counts published views; it is not a fencing generation
//     (ids.Generation, BackendSpec.Gen), and the two never convert into
//     each other.
package apiv1
