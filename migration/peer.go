package migration

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/quic-go/quic-go"

	"tern/instance/apiv1"
)

// NextProto is the ALPN protocol of migration connections.
const NextProto = "tern-migrate/1"

// peer is one side's end of the migration stream.
type peer struct {
	conn *quic.Conn
	s    *quic.Stream
}

// send writes m as one frame.
func (p *peer) send(m any) error {
	b, err := frame(m)
	if err != nil {
		return err
	}
	if _, err := p.s.Write(b); err != nil {
		return fmt.Errorf("sending %T: %w", m, remote(err))
	}
	return nil
}

// sendThen writes m as one frame, calling beforeLast once every byte but
// the last is written: a time taken there comes before the peer can have
// read the whole frame (so before anything it does on reading it).
func (p *peer) sendThen(m any, beforeLast func()) error {
	b, err := frame(m)
	if err != nil {
		return err
	}
	if _, err := p.s.Write(b[:len(b)-1]); err != nil {
		return fmt.Errorf("sending %T: %w", m, remote(err))
	}
	beforeLast()
	if _, err := p.s.Write(b[len(b)-1:]); err != nil {
		return fmt.Errorf("sending %T: %w", m, remote(err))
	}
	return nil
}

// recv reads the next message; an error message from the peer is
// returned as a *RemoteError.
func (p *peer) recv() (any, error) {
	t, payload, err := readFrame(p.s)
	if err != nil {
		return nil, fmt.Errorf("receiving message: %w", remote(err))
	}
	m, err := decodeMessage(t, payload)
	if err != nil {
		return nil, err
	}
	if e, ok := m.(errorMsg); ok {
		return nil, &RemoteError{Code: e.Code, Message: e.Message}
	}
	return m, nil
}

// expect receives a message of type T.
func expect[T any](p *peer) (T, error) {
	var zero T
	m, err := p.recv()
	if err != nil {
		return zero, err
	}
	v, ok := m.(T)
	if !ok {
		return zero, fmt.Errorf("receiving message: %w: got %T, want %T", ErrMalformed, m, zero)
	}
	return v, nil
}

// expectEmpty receives the empty message t.
func expectEmpty(p *peer, t msgType) error {
	m, err := expect[empty](p)
	if err == nil && m.Type != t {
		err = fmt.Errorf("receiving message: %w: got %v, want %v", ErrMalformed, m.Type, t)
	}
	return err
}

// expectResumed receives the target's resumed: with its times from
// versionTargetTimes on, without them before.
func expectResumed(p *peer, v apiv1.MigrationVersion) (targetTimes, error) {
	if v < versionTargetTimes {
		return targetTimes{}, expectEmpty(p, msgResumed)
	}
	m, err := expect[resumedMsg](p)
	return m.Times, err
}

// remote turns the peer closing the connection with an application error
// into a *RemoteError.
func remote(err error) error {
	var ae *quic.ApplicationError
	if errors.As(err, &ae) && ae.Remote {
		return &RemoteError{Code: uint16(ae.ErrorCode), Message: ae.ErrorMessage}
	}
	return err
}

// abort tells the peer why the migration failed (an error frame, then the
// connection closed with the same code and text) and returns at once.
func (p *peer) abort(cause error) {
	var re *RemoteError
	if errors.As(cause, &re) { // the peer knows
		p.conn.CloseWithError(quic.ApplicationErrorCode(re.Code), re.Message)
		return
	}
	msg := cause.Error()
	if len(msg) > 512 {
		msg = msg[:512]
	}
	code := codeOf(cause)
	if p.s != nil {
		p.s.SetWriteDeadline(time.Now().Add(time.Second))
		p.send(errorMsg{Code: code, Message: msg})
	}
	p.conn.CloseWithError(quic.ApplicationErrorCode(code), msg)
}

// waitClosed waits until the peer closed its side of the stream or the
// connection, or d passes: what lets the last message of one side arrive
// before the other closes the connection.
func (p *peer) waitClosed(d time.Duration) {
	p.s.SetReadDeadline(time.Now().Add(d))
	io.Copy(io.Discard, p.s)
}
