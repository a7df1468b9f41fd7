// Package tlsconf creates tern's development certificate authority and turns
// a certificate directory into mutual-TLS configurations.
//
// A certificate directory holds four PEM files: ca.pem and ca-key.pem (the
// authority), node.pem and node-key.pem (one leaf usable as both TLS server
// and TLS client). Every tern endpoint that speaks QUIC (downstairs,
// upstairs, migration) or HTTPS presents the node certificate and accepts
// only peers whose certificate chains to ca.pem: servers require and verify
// client certificates, clients verify the server against the same CA.
// Beside them Generate links the names GnuTLS-based clients look for
// (Aliases: ca-cert.pem, client-cert.pem, client-key.pem, server-cert.pem,
// server-key.pem), so libnbd's tls-certificates and qemu's tls-creds-x509
// take the directory as it is.
//
// Invariants:
//   - Generate writes all four files or none: it stages them as temporary
//     files in the target directory and renames them into place only after
//     every one was written and synced. Private keys are mode 0600.
//   - Generate never overwrites existing files unless asked to (force).
//   - Configurations are TLS 1.3 only.
package tlsconf
