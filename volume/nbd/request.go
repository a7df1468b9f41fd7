package nbd

import (
	"encoding/binary"
	"fmt"
)

// request is one transmission-phase request header.
type request struct {
	flags  uint16
	cmd    uint16
	cookie uint64
	offset uint64
	length uint32
}

// parseRequest decodes a request header. It checks only the magic: what
// a command may carry is the connection's to judge (checkRequest), since
// the answer to a bad request is an error reply, not a disconnect.
func parseRequest(b *[requestHeaderBytes]byte) (request, error) {
	if m := binary.BigEndian.Uint32(b[0:]); m != magicRequest {
		return request{}, fmt.Errorf("request magic %#x: %w", m, ErrBadMagic)
	}
	return request{
		flags:  binary.BigEndian.Uint16(b[4:]),
		cmd:    binary.BigEndian.Uint16(b[6:]),
		cookie: binary.BigEndian.Uint64(b[8:]),
		offset: binary.BigEndian.Uint64(b[16:]),
		length: binary.BigEndian.Uint32(b[24:]),
	}, nil
}

// geometry is what checkRequest judges a request against.
type geometry struct {
	size      uint64
	blockSize uint32
	readOnly  bool
}

// verdict is what the connection does with a request: serve it, answer
// it with an errno (after reading any payload it carries), or drop the
// connection because the stream cannot be trusted past it.
type verdict struct {
	errno Errno
	// disconnect is why the connection must end, "" if it need not.
	disconnect string
	// payload is how many bytes of data follow the header on the wire.
	payload uint32
}

// checkRequest decides what r deserves on an export of geometry g. It is
// pure: the whole policy on malformed, misaligned, out-of-range and
// forbidden requests is here.
func checkRequest(r request, g geometry) verdict {
	var v verdict
	if r.cmd == cmdWrite {
		v.payload = r.length
	}
	if (r.cmd == cmdRead || r.cmd == cmdWrite) && r.length > MaxRequestBytes {
		v.disconnect = fmt.Sprintf("%s of %d bytes, more than the %d advertised", cmdName(r.cmd), r.length, MaxRequestBytes)
		return v
	}
	var allowed uint16
	switch r.cmd {
	case cmdRead, cmdFlush, cmdDisc:
	case cmdWrite, cmdTrim:
		allowed = cmdFlagFUA
	case cmdWriteZeroes:
		allowed = cmdFlagFUA | cmdFlagNoHole
	default:
		v.errno = EINVAL
		return v
	}
	if r.flags&^allowed != 0 {
		v.errno = EINVAL
		return v
	}
	switch r.cmd {
	case cmdFlush, cmdDisc:
		if r.offset != 0 || r.length != 0 {
			v.errno = EINVAL
		}
		return v
	}
	writes := r.cmd != cmdRead
	if writes && g.readOnly {
		v.errno = EPERM
		return v
	}
	bs := uint64(g.blockSize)
	end := r.offset + uint64(r.length)
	switch {
	case end < r.offset:
		v.errno = EINVAL // wraps around
	case r.offset%bs != 0 || uint64(r.length)%bs != 0:
		v.errno = EINVAL
	case end > g.size && writes:
		v.errno = ENOSPC
	case end > g.size:
		v.errno = EINVAL
	}
	return v
}

// cmdName names a command for logs.
func cmdName(c uint16) string {
	switch c {
	case cmdRead:
		return "READ"
	case cmdWrite:
		return "WRITE"
	case cmdDisc:
		return "DISC"
	case cmdFlush:
		return "FLUSH"
	case cmdTrim:
		return "TRIM"
	case cmdWriteZeroes:
		return "WRITE_ZEROES"
	}
	return fmt.Sprintf("command %d", c)
}
