package dsclient

import (
	"context"
	"crypto/tls"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/quic-go/quic-go"

	"tern/volume/transport"
	"tern/volume/wire"
)

// Options tune a session's connection and setup.
type Options struct {
	// Dial decides how soon a silent peer is given up (and, in the EC
	// simulation, which network carries the session).
	Dial transport.DialOptions
	// ReplyTimeout, when set, bounds each reply of the setup and of Call:
	// a downstairs that stalls during the handshake ends the session
	// instead of holding it. Zero leaves the replies unbounded (but for
	// the stream's deadline).
	ReplyTimeout time.Duration
}

// Conn is one session to a downstairs: a QUIC connection and its one
// session stream, with the stream's encoder and decoder. The caller
// owns it and must Close it.
type Conn struct {
	// Immutable after Dial.
	conn         *quic.Conn
	stream       *quic.Stream
	enc          *wire.Encoder
	dec          *wire.Decoder
	replyTimeout time.Duration

	// sessionID is the Hello's, repeated by Activate; set by Hello.
	sessionID uuid.UUID
}

// Dial connects to the downstairs at target and opens the session
// stream. A failed dial returns the transport's error; a stream that
// cannot be opened, an *Error of StepStream. If ctx has a deadline, the
// stream's deadline is set to it (SetDeadline lifts it).
func Dial(ctx context.Context, target string, conf *tls.Config, opts Options) (*Conn, error) {
	conn, err := transport.DialWith(ctx, target, conf, opts.Dial)
	if err != nil {
		return nil, err
	}
	stream, err := conn.OpenStreamSync(ctx)
	if err != nil {
		_ = conn.CloseWithError(0, "")
		return nil, &Error{Step: StepStream, Failure: FailSend, Err: err}
	}
	if d, ok := ctx.Deadline(); ok {
		_ = stream.SetDeadline(d)
	}
	return &Conn{conn: conn, stream: stream, enc: wire.NewEncoder(stream), dec: wire.NewDecoder(stream),
		replyTimeout: opts.ReplyTimeout}, nil
}

// Close closes the connection with reason (application code 0, which a
// downstairs takes for the normal end of a session). A Receive blocked on
// the stream returns then; closing twice is harmless.
func (c *Conn) Close(reason string) {
	_ = c.conn.CloseWithError(0, reason)
}

// SetDeadline sets the stream's read and write deadline; the zero time
// lifts it.
func (c *Conn) SetDeadline(t time.Time) error { return c.stream.SetDeadline(t) }

// SetReadDeadline sets the stream's read deadline; the zero time lifts it.
func (c *Conn) SetReadDeadline(t time.Time) error { return c.stream.SetReadDeadline(t) }

// SetDataBuffer chooses where the bulk data of each reply goes (see
// wire.Decoder.DataBuffer); set it before receiving on another
// goroutine.
func (c *Conn) SetDataBuffer(f wire.DataBufferFunc) { c.dec.DataBuffer = f }

// Send encodes m on the session stream.
func (c *Conn) Send(m wire.Message) error { return c.enc.Encode(m) }

// Receive decodes the next message from the downstairs. It lives in the
// decoder until the next Receive (wire.Decoder.Next), except bulk data a
// DataBuffer placed.
func (c *Conn) Receive() (wire.Message, error) { return c.dec.Next() }

// Call sends req stamped with job id (wire.SetJobID) and reads the next
// reply, which must answer it. An Error reply, a reply to another job
// (FailMismatch) or a failed send or read comes back as an *Error of
// StepCall. The reply lives in the decoder until the next Receive or
// Call.
func (c *Conn) Call(req wire.Message, id wire.JobID) (wire.Message, error) {
	fail := func(f Failure, err error) (wire.Message, error) {
		return nil, &Error{Step: StepCall, Failure: f, Req: req.Type(), Err: err}
	}
	if !wire.SetJobID(req, id) {
		return fail(FailSend, errNotRequest)
	}
	if err := c.Send(req); err != nil {
		return fail(FailSend, err)
	}
	m, err := c.reply()
	if err != nil {
		return fail(FailReceive, err)
	}
	if e, ok := m.(*wire.Error); ok {
		return nil, &Error{Step: StepCall, Failure: FailRefused, Req: req.Type(), Got: m.Type(), Code: e.Code, Err: e.Err()}
	}
	if got, _ := wire.JobOf(m); got != id {
		return nil, &Error{Step: StepCall, Failure: FailMismatch, Req: req.Type(), Got: m.Type()}
	}
	return m, nil
}

// reply reads one reply of the setup or of a Call, within the reply
// timeout when there is one.
func (c *Conn) reply() (wire.Message, error) {
	if c.replyTimeout <= 0 {
		return c.dec.Next()
	}
	if err := c.stream.SetReadDeadline(time.Now().Add(c.replyTimeout)); err != nil {
		return nil, err
	}
	m, err := c.dec.Next()
	if err != nil {
		return nil, fmt.Errorf("no reply within %v: %w", c.replyTimeout, err)
	}
	return m, nil
}
