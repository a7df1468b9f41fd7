// Package wire defines the protocol spoken between an upstairs (the volume
// client) and a downstairs (one replica of a region): typed identifiers,
// message types, length-prefixed binary framing and version negotiation.
//
// The package is pure: it does no networking of its own and keeps no state
// beyond reusable buffers. An Encoder writes frames to an io.Writer and a
// Decoder reads them from an io.Reader; the transport (a QUIC stream, see
// package tern/volume/transport) is supplied by the caller.
//
// # Frames
//
// Every frame is an 8-byte header followed by a payload, all little endian:
//
//	magic   u16  FrameMagic, rejects a peer that is not speaking this protocol
//	type    u16  MsgType
//	length  u32  payload bytes after the header, at most MaxPayload
//
// Messages that carry bulk block data (Write, ReadResponse, RepairData,
// RepairWrite) put their fixed fields and small arrays first and the data
// last, so the data is written straight from the caller's slice and read
// straight into a caller-chosen buffer (Decoder.DataBuffer).
//
// # Session
//
//  1. The client sends Hello with every ProtocolVersion it speaks. The
//     server answers HelloReply with the highest version both speak and the
//     region geometry, or Error{Code: CodeVersionMismatch} (or
//     CodeRegionMismatch) and closes. Hello, HelloReply and Error are frozen:
//     their encoding never changes between protocol versions.
//  2. A read-write client sends Activate with its generation; the server
//     answers ActivateAck or an Error (CodeGenTooLow). A later activation with
//     a higher generation fences this session: the server sends Fenced.
//  3. Requests (everything carrying a JobID) are answered by exactly one
//     reply carrying the same JobID: Ack, ActivateAck, ReadResponse,
//     RegionInfoReply, ExtentVersions, ExtentHashes, RepairData, Fenced or
//     Error. Replies may arrive in any order.
//
// # Invariants
//
//   - A decoder never panics and never allocates a buffer sized by a length
//     it has not checked against MaxPayload and the bytes actually remaining
//     in the frame; malformed, truncated or oversized input is an error
//     wrapping ErrMalformed, ErrFrameTooLarge, ErrBadMagic or ErrUnknownType.
//   - Encoding never copies bulk data into an intermediate buffer, and
//     neither encoding nor decoding allocates once its buffers have grown to
//     the working size (the steady state).
//   - A repair block list (RepairRead, RepairData, RepairWrite) is strictly
//     increasing: the Encoder refuses, and the Decoder rejects as
//     ErrMalformed, a list with a duplicate or out of order, so no receiver
//     has to decide which copy of a block wins. That the blocks lie inside
//     the extent is the receiver's check (it knows the region).
//   - A decoded message, and every slice in it except data placed in a buffer
//     returned by DataBuffer, belongs to the Decoder and is valid only until
//     the next call to Next.
package wire
