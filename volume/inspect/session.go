package inspect

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"

	"github.com/google/uuid"

	"tern/volume/dsclient"
	"tern/volume/ids"
	"tern/volume/wire"
)

// session is one synchronous read-only session (volume/dsclient's, never
// activated): a request, then its reply.
type session struct {
	c      *dsclient.Conn
	region wire.RegionInfo
	next   wire.JobID
}

func dialReadOnly(ctx context.Context, addr string, conf *tls.Config) (*session, error) {
	c, err := dsclient.Dial(ctx, addr, conf, dsclient.Options{})
	if err != nil {
		return nil, probeError(err)
	}
	region, err := c.Hello(dsclient.HelloParams{ReadOnly: true, UpstairsID: uuid.New()})
	if err != nil {
		c.Close("")
		return nil, probeError(err)
	}
	return &session{c: c, region: region}, nil
}

// extentVersions reads every extent's version, a frame at a time.
func (s *session) extentVersions() ([]wire.ExtentVersion, error) {
	out := make([]wire.ExtentVersion, 0, s.region.ExtentCount)
	for uint32(len(out)) < s.region.ExtentCount {
		s.next++
		count := min(s.region.ExtentCount-uint32(len(out)), wire.MaxExtentVersions)
		m, err := s.c.Call(&wire.ExtentVersionsRequest{First: ids.ExtentID(len(out)), Count: uint32(count)}, s.next)
		if err != nil {
			return nil, probeError(err)
		}
		switch r := m.(type) {
		case *wire.ExtentVersions:
			if int(r.First) != len(out) || len(r.Versions) == 0 {
				return nil, errReplyMismatch
			}
			out = append(out, r.Versions...)
		default:
			return nil, fmt.Errorf("read extent versions: unexpected %v", m.Type())
		}
	}
	return out[:s.region.ExtentCount], nil
}

func (s *session) close() {
	s.c.Close("")
}

var errReplyMismatch = errors.New("read extent versions: reply does not match the request")

// probeError words a failed step of a probe's session as `tern volume
// status` has always printed it (cmd/tern's reachReason shows it).
func probeError(err error) error {
	var e *dsclient.Error
	if !errors.As(err, &e) {
		return err // the dial's own error
	}
	switch {
	case e.Step == dsclient.StepStream:
		return fmt.Errorf("open session stream: %w", e.Err)
	case e.Step == dsclient.StepHello && e.Failure == dsclient.FailSend:
		return fmt.Errorf("send hello: %w", e.Err)
	case e.Step == dsclient.StepHello && e.Failure == dsclient.FailReceive:
		return fmt.Errorf("read hello reply: %w", e.Err)
	case e.Step == dsclient.StepHello && e.Failure == dsclient.FailRefused:
		return fmt.Errorf("hello refused: %w", e.Err)
	case e.Step == dsclient.StepHello:
		return fmt.Errorf("hello: unexpected %v", e.Got)
	case e.Failure == dsclient.FailSend:
		return fmt.Errorf("request extent versions: %w", e.Err)
	case e.Failure == dsclient.FailReceive, e.Failure == dsclient.FailRefused:
		return fmt.Errorf("read extent versions: %w", e.Err)
	case e.Got == wire.TypeExtentVersions:
		return errReplyMismatch
	}
	return fmt.Errorf("read extent versions: unexpected %v", e.Got)
}
