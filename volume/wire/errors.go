package wire

import (
	"errors"
	"fmt"
)

// Framing errors. Every decoding failure wraps one of them.
var (
	// ErrBadMagic means the frame header does not start with FrameMagic.
	ErrBadMagic = errors.New("bad frame magic")
	// ErrFrameTooLarge means a header announced more than MaxPayload bytes.
	ErrFrameTooLarge = errors.New("frame too large")
	// ErrUnknownType means a header names no message type of this protocol.
	ErrUnknownType = errors.New("unknown message type")
	// ErrMalformed means a payload does not decode as its message type.
	ErrMalformed = errors.New("malformed message")
	// ErrTooLarge means a message given to the Encoder exceeds a limit.
	ErrTooLarge = errors.New("message exceeds protocol limit")
)

// ErrorCode says why a request failed. It implements error, so a caller can
// test a RemoteError with errors.Is(err, wire.CodeFenced).
type ErrorCode uint16

// Error codes. The numbers are part of the protocol and never reused.
const (
	// CodeUnknown is an unclassified failure.
	CodeUnknown ErrorCode = 0
	// CodeHashMismatch: write data does not match the hashes sent with it;
	// nothing was stored.
	CodeHashMismatch ErrorCode = 1
	// CodeOutOfRange: the request names blocks or extents past the region.
	CodeOutOfRange ErrorCode = 2
	// CodeIO: the downstairs failed to read or write its files.
	CodeIO ErrorCode = 3
	// CodeCorruptBlock: a stored block does not match its recorded hash.
	CodeCorruptBlock ErrorCode = 4
	// CodeFenced: the session was fenced by a higher generation.
	CodeFenced ErrorCode = 5
	// CodeNotActive: the request needs an activated session.
	CodeNotActive ErrorCode = 6
	// CodeReadOnly: the request writes but the session is read-only.
	CodeReadOnly ErrorCode = 7
	// CodeVersionMismatch: client and server share no protocol version.
	CodeVersionMismatch ErrorCode = 8
	// CodeRegionMismatch: the region is not the one the client asked for.
	CodeRegionMismatch ErrorCode = 9
	// CodeGenTooLow: activation refused, the generation is not higher than
	// the highest the downstairs has accepted.
	CodeGenTooLow ErrorCode = 10
	// CodeBadRequest: the request is well-formed but makes no sense (wrong
	// data length, a message out of turn).
	CodeBadRequest ErrorCode = 11
	// CodeShuttingDown: the downstairs is stopping.
	CodeShuttingDown ErrorCode = 12
)

// codeNames is an array, not a map: a constant table the linker lays
// out, with no work when the process starts.
var codeNames = [...]string{
	CodeUnknown:         "unknown error",
	CodeHashMismatch:    "hash mismatch",
	CodeOutOfRange:      "out of range",
	CodeIO:              "io error",
	CodeCorruptBlock:    "corrupt block",
	CodeFenced:          "fenced",
	CodeNotActive:       "not active",
	CodeReadOnly:        "read only",
	CodeVersionMismatch: "version mismatch",
	CodeRegionMismatch:  "region mismatch",
	CodeGenTooLow:       "generation too low",
	CodeBadRequest:      "bad request",
	CodeShuttingDown:    "shutting down",
}

// Error returns the code's name.
func (c ErrorCode) Error() string {
	if int(c) < len(codeNames) && codeNames[c] != "" {
		return codeNames[c]
	}
	return fmt.Sprintf("error code %d", uint16(c))
}

// RemoteError is an Error message received from the peer as a Go error. It
// unwraps to its Code.
type RemoteError struct {
	Code    ErrorCode
	Message string
}

// Error implements error.
func (e *RemoteError) Error() string {
	if e.Message == "" {
		return "remote: " + e.Code.Error()
	}
	return "remote: " + e.Code.Error() + ": " + e.Message
}

// Unwrap returns the error code.
func (e *RemoteError) Unwrap() error { return e.Code }
