package nbd

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Errors of the decoders. A handshake or transmission that meets one ends
// that connection (after the protocol's answer, where it has one); no
// decoder panics or allocates by what a client claims.
var (
	// ErrBadMagic: a greeting, option or request did not start with its
	// magic number: the client is not speaking NBD, or lost its place.
	ErrBadMagic = errors.New("bad magic")
	// ErrTooLarge: an option or request is larger than this server
	// accepts; its data cannot be skipped safely.
	ErrTooLarge = errors.New("too large")
	// ErrMalformed: an option's data does not parse.
	ErrMalformed = errors.New("malformed")
)

// optionHeader is one option's header as the client sent it.
type optionHeader struct {
	option uint32
	length uint32
}

// parseOptionHeader decodes the 16 bytes before an option's data.
func parseOptionHeader(b *[optionHeaderBytes]byte) (optionHeader, error) {
	if m := binary.BigEndian.Uint64(b[0:]); m != magicOption {
		return optionHeader{}, fmt.Errorf("option magic %#x: %w", m, ErrBadMagic)
	}
	h := optionHeader{option: binary.BigEndian.Uint32(b[8:]), length: binary.BigEndian.Uint32(b[12:])}
	if h.length > maxOptionBytes {
		return h, fmt.Errorf("option %d carries %d bytes, more than %d: %w", h.option, h.length, maxOptionBytes, ErrTooLarge)
	}
	return h, nil
}

// exportRequest is the data of NBD_OPT_INFO and NBD_OPT_GO: the export's
// name and the information types the client asks for.
type exportRequest struct {
	name  string
	infos []uint16
}

// wants reports whether the client asked for info type t.
func (r exportRequest) wants(t uint16) bool {
	for _, i := range r.infos {
		if i == t {
			return true
		}
	}
	return false
}

// parseExportRequest decodes NBD_OPT_INFO/NBD_OPT_GO data: a 32-bit name
// length, the name, a 16-bit count and that many 16-bit info types,
// nothing after.
func parseExportRequest(data []byte) (exportRequest, error) {
	var r exportRequest
	if len(data) < 4 {
		return r, fmt.Errorf("%d bytes, no name length: %w", len(data), ErrMalformed)
	}
	n := binary.BigEndian.Uint32(data)
	rest := data[4:]
	if n > maxNameBytes {
		return r, fmt.Errorf("name of %d bytes, longer than %d: %w", n, maxNameBytes, ErrMalformed)
	}
	if uint32(len(rest)) < n+2 {
		return r, fmt.Errorf("name of %d bytes in %d: %w", n, len(rest), ErrMalformed)
	}
	r.name, rest = string(rest[:n]), rest[n:]
	count := int(binary.BigEndian.Uint16(rest))
	rest = rest[2:]
	if len(rest) != 2*count {
		return r, fmt.Errorf("%d info requests in %d bytes: %w", count, len(rest), ErrMalformed)
	}
	r.infos = make([]uint16, count)
	for i := range r.infos {
		r.infos[i] = binary.BigEndian.Uint16(rest[2*i:])
	}
	return r, nil
}

// appendOptionReply appends one option reply (header and data) to b.
func appendOptionReply(b []byte, option, replyType uint32, data []byte) []byte {
	b = binary.BigEndian.AppendUint64(b, magicOptionReply)
	b = binary.BigEndian.AppendUint32(b, option)
	b = binary.BigEndian.AppendUint32(b, replyType)
	b = binary.BigEndian.AppendUint32(b, uint32(len(data)))
	return append(b, data...)
}

// infoExportData is NBD_INFO_EXPORT: size and transmission flags.
func infoExportData(size uint64, flags uint16) []byte {
	b := binary.BigEndian.AppendUint16(nil, infoExport)
	b = binary.BigEndian.AppendUint64(b, size)
	return binary.BigEndian.AppendUint16(b, flags)
}

// infoBlockSizeData is NBD_INFO_BLOCK_SIZE: minimum, preferred, maximum.
func infoBlockSizeData(minimum, preferred, maximum uint32) []byte {
	b := binary.BigEndian.AppendUint16(nil, infoBlockSize)
	b = binary.BigEndian.AppendUint32(b, minimum)
	b = binary.BigEndian.AppendUint32(b, preferred)
	return binary.BigEndian.AppendUint32(b, maximum)
}

// infoStringData is NBD_INFO_NAME or NBD_INFO_DESCRIPTION.
func infoStringData(t uint16, s string) []byte {
	return append(binary.BigEndian.AppendUint16(nil, t), s...)
}

// serverListData is one NBD_REP_SERVER entry of NBD_OPT_LIST.
func serverListData(name string) []byte {
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(name))), name...)
}
