// Package nbd serves a block device over the NBD protocol (the NBD
// project's doc/proto.md), so that the tools people already have —
// qemu-img, qemu-io, QEMU's `-drive file=nbd://…`, libnbd's nbdinfo,
// nbdcopy and nbdfuse, fio's nbd engine, the kernel's nbd client — can use
// a tern volume.
//
// # What it speaks
//
// Fixed-newstyle negotiation only: NBD_OPT_GO, NBD_OPT_INFO (size, flags,
// block sizes: minimum the device's block size, preferred 4 KiB or more,
// maximum MaxRequestBytes), NBD_OPT_LIST, NBD_OPT_ABORT,
// NBD_OPT_STRUCTURED_REPLY, NBD_OPT_STARTTLS (required first when the
// server has a TLS config) and the old NBD_OPT_EXPORT_NAME. Commands READ,
// WRITE (with FUA), FLUSH, TRIM (advisory: a no-op), WRITE_ZEROES (with
// FUA; NO_HOLE is accepted and changes nothing, as nothing is ever
// punched), DISC. With structured replies a READ is answered by one
// OFFSET_DATA chunk, other commands by NONE, failures by ERROR, each
// carrying DONE.
//
// # Structure
//
// The decoders (parseOptionHeader, parseExportRequest, parseRequest) and
// the request policy (checkRequest: which errno a request deserves, or
// whether the stream must be dropped) are pure functions over bytes and
// plain values, fuzzed. negotiate drives the handshake. Each connection
// has a reader, which owns the request stream and starts one goroutine
// per request, and a writer, which owns the reply stream and sends each
// reply as its request completes (matched by cookie, so replies may
// overtake each other). A budget bounds the requests in flight per
// connection and the bytes they hold.
//
// # Invariants
//
//  1. A reply is sent only after its device call returned: a WRITE is
//     acknowledged once the device completed it, a FLUSH or FUA once the
//     device flushed. Every connection shares one volume, so a flush on
//     any of them covers every write completed on all of them
//     (CAN_MULTI_CONN).
//  2. A READ's reply header is built only after its data was read, so a
//     failed read is an error reply, never a header followed by garbage.
//  3. Bad input never panics and never allocates by what the client
//     claims: an option's data is bounded (64 KiB), a request's payload
//     by MaxRequestBytes. A request the export cannot serve (misaligned,
//     out of range, a write to a read-only export, unknown flags or
//     command) gets its errno and the connection carries on; bytes that
//     are not a request, or a READ/WRITE larger than advertised, end that
//     connection, with the reason logged. No other connection notices.
//  4. Shutdown stops reading at the next request boundary, lets every
//     request already read complete and its reply go out, and only then
//     closes; a write cut off mid-payload is answered ESHUTDOWN. The
//     caller flushes the device afterwards.
//
// # Errnos
//
// EINVAL: misaligned, out of range for a READ, malformed. ENOSPC: a write,
// trim or zeroing that reaches past the end. EPERM: a write to a
// read-only export. EIO: the device failed. ESHUTDOWN: a write whose
// payload the shutdown cut off.
package nbd
