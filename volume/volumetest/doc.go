// Package volumetest runs real volume servers for tests and benchmarks, as
// net/http/httptest runs HTTP servers: three downstairs on loopback, each
// serving a region in its own directory over QUIC with mutual TLS from a
// fresh development CA. Replicas can be stopped and restarted on the same
// address to simulate crashes and outages.
package volumetest
