// Package httpjson is what tern's three HTTP servers (the vmm API in
// instance/api, the host agent, the control plane) share: a JSON answer,
// an error body, strict decoding of a request, and the after_gen
// long-poll on a generation.
//
// It owns the wire shapes those servers have in common, so they stay
// alike byte for byte: an answer is the value's encoding/json form and a
// newline; an error is {"error_code": …, "message": …} (the vmm API adds
// fields of its own to the same object); a request body is one JSON value
// with no unknown field and nothing after it.
package httpjson
