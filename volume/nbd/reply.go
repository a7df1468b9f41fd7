package nbd

import "encoding/binary"

// reply is one finished request on its way to the writer: the header is
// built from it there, so encoding never races with other replies.
type reply struct {
	cookie uint64
	cmd    uint16
	offset uint64 // of a READ, for its OFFSET_DATA chunk
	errno  Errno
	// message explains an error in a structured reply.
	message string
	// data is a READ's payload; buf, when not nil, is returned to the
	// pool once written.
	data []byte
	buf  *buffer
	// release is the request's share of the connection's budget, which
	// the writer gives back once the reply is sent.
	release int64
}

// appendSimpleReply appends a simple reply header (a READ's data follows
// it on the wire).
func appendSimpleReply(b []byte, cookie uint64, errno Errno) []byte {
	b = binary.BigEndian.AppendUint32(b, magicSimple)
	b = binary.BigEndian.AppendUint32(b, uint32(errno))
	return binary.BigEndian.AppendUint64(b, cookie)
}

// appendChunkHeader appends a structured reply chunk header for a chunk
// whose payload is length bytes.
func appendChunkHeader(b []byte, cookie uint64, flags, chunkType uint16, length uint32) []byte {
	b = binary.BigEndian.AppendUint32(b, magicStructured)
	b = binary.BigEndian.AppendUint16(b, flags)
	b = binary.BigEndian.AppendUint16(b, chunkType)
	b = binary.BigEndian.AppendUint64(b, cookie)
	return binary.BigEndian.AppendUint32(b, length)
}

// maxErrorMessage bounds an error chunk's message (the protocol allows
// 4096 bytes).
const maxErrorMessage = 4096

// appendStructuredReply appends the whole of r but a READ's data as
// structured chunks: one OFFSET_DATA chunk (its data follows), or one
// NONE or ERROR chunk, each carrying the DONE flag.
func appendStructuredReply(b []byte, r *reply) []byte {
	switch {
	case r.errno != 0:
		msg := r.message
		if len(msg) > maxErrorMessage {
			msg = msg[:maxErrorMessage]
		}
		b = appendChunkHeader(b, r.cookie, replyFlagDone, replyError, uint32(6+len(msg)))
		b = binary.BigEndian.AppendUint32(b, uint32(r.errno))
		b = binary.BigEndian.AppendUint16(b, uint16(len(msg)))
		return append(b, msg...)
	case r.cmd == cmdRead && len(r.data) > 0:
		b = appendChunkHeader(b, r.cookie, replyFlagDone, replyOffsetData, uint32(8+len(r.data)))
		return binary.BigEndian.AppendUint64(b, r.offset)
	default:
		return appendChunkHeader(b, r.cookie, replyFlagDone, replyNone, 0)
	}
}
