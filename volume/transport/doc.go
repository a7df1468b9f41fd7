// Package transport carries the volume protocol (package tern/volume/wire)
// over QUIC with mutual TLS: Listen on the downstairs, Dial on the
// upstairs, both with the one quic.Config tuned for block IO (Config);
// the dialer chooses how soon a silent peer is given up (DialOptions:
// by default a peer that sends nothing for IdleTimeout, 4 s, is gone).
//
// # Connection and stream layout
//
// One QUIC connection per (upstairs, downstairs) pair. On it the upstairs
// opens exactly one bidirectional stream, the session stream, and sends
// Hello first; every frame of the session (negotiation, activation,
// region queries, IO, repair) travels on that stream, and the downstairs
// answers on the same stream, in completion order, matched by JobID.
//
// Why one stream rather than a control stream plus a pool of IO streams:
//
//   - Order is the protocol's foundation. The downstairs job engine runs a
//     job once its listed dependencies and every earlier overlapping job
//     have completed; "earlier" is arrival order, which equals the
//     upstairs' JobID order only if requests share one ordered stream.
//     Fencing needs the same single order: the point where a takeover
//     happens must be a point in one sequence of requests. With several
//     streams the downstairs could see job 1001 before job 1000 and could
//     not tell "not yet arrived" from "long done".
//   - It costs no throughput. The two directions of a QUIC stream are
//     independent, so read data flowing down never delays requests flowing
//     up. All streams of a connection share one congestion window anyway;
//     with the large per-stream window below (MaxStreamWindow) a single
//     stream keeps 32 queued 1 MiB writes in flight (measured in
//     tern/volume/downstairs' BenchmarkWrite1MiBQD32).
//   - Head-of-line blocking is what one ordered byte stream always has: a
//     small request queued behind a 1 MiB write waits for that write's
//     bytes, as it would behind the same bytes on any shared link. Lost
//     packets delay only this session, never another replica's connection.
//
// # Invariants
//
//   - Every connection is mutually authenticated: servers require and
//     verify a client certificate (the tls.Config comes from
//     tern/internal/tlsconf), and the ALPN protocol is NextProto.
//   - Listen and Dial own the UDP sockets they create: Listener.Close
//     closes the socket, and a dialed connection's socket closes when the
//     connection does.
package transport
