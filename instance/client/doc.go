// Package client is the Go client of the vmm control API (package api),
// used by `tern instance` and the tests. Every non-2xx answer becomes an
// *APIError carrying the server's error_code, so callers branch with
// errors.As or IsCode instead of parsing messages.
//
// Driving a live migration between two servers with this client is
// instance/runner's (what `tern migrate` and `tern bench migrate` run).
package client
