package inspect

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/quic-go/quic-go"

	"tern/volume/ids"
	"tern/volume/transport"
	"tern/volume/wire"
)

// session is one synchronous read-only session: a request, then its reply.
type session struct {
	conn   *quic.Conn
	stream *quic.Stream
	enc    *wire.Encoder
	dec    *wire.Decoder
	region wire.RegionInfo
	next   wire.JobID
}

func dialReadOnly(ctx context.Context, addr string, conf *tls.Config) (*session, error) {
	conn, err := transport.Dial(ctx, addr, conf)
	if err != nil {
		return nil, err
	}
	stream, err := conn.OpenStreamSync(ctx)
	if err != nil {
		conn.CloseWithError(0, "")
		return nil, fmt.Errorf("open session stream: %w", err)
	}
	s := &session{conn: conn, stream: stream, enc: wire.NewEncoder(stream), dec: wire.NewDecoder(stream)}
	if d, ok := ctx.Deadline(); ok {
		stream.SetDeadline(d)
	}
	hello := &wire.Hello{Versions: wire.SupportedVersions, ReadOnly: true, UpstairsID: uuid.New(), SessionID: uuid.New()}
	if err := s.enc.Encode(hello); err != nil {
		s.close()
		return nil, fmt.Errorf("send hello: %w", err)
	}
	m, err := s.dec.Next()
	if err != nil {
		s.close()
		return nil, fmt.Errorf("read hello reply: %w", err)
	}
	switch r := m.(type) {
	case *wire.HelloReply:
		s.region = r.Region
		return s, nil
	case *wire.Error:
		s.close()
		return nil, fmt.Errorf("hello refused: %w", r.Err())
	default:
		s.close()
		return nil, fmt.Errorf("hello: unexpected %v", m.Type())
	}
}

// extentVersions reads every extent's version, a frame at a time.
func (s *session) extentVersions() ([]wire.ExtentVersion, error) {
	out := make([]wire.ExtentVersion, 0, s.region.ExtentCount)
	for uint32(len(out)) < s.region.ExtentCount {
		s.next++
		count := min(s.region.ExtentCount-uint32(len(out)), wire.MaxExtentVersions)
		req := &wire.ExtentVersionsRequest{JobID: s.next, First: ids.ExtentID(len(out)), Count: uint32(count)}
		if err := s.enc.Encode(req); err != nil {
			return nil, fmt.Errorf("request extent versions: %w", err)
		}
		m, err := s.dec.Next()
		if err != nil {
			return nil, fmt.Errorf("read extent versions: %w", err)
		}
		switch r := m.(type) {
		case *wire.ExtentVersions:
			if r.JobID != s.next || int(r.First) != len(out) || len(r.Versions) == 0 {
				return nil, errors.New("read extent versions: reply does not match the request")
			}
			out = append(out, r.Versions...)
		case *wire.Error:
			return nil, fmt.Errorf("read extent versions: %w", r.Err())
		default:
			return nil, fmt.Errorf("read extent versions: unexpected %v", m.Type())
		}
	}
	return out[:s.region.ExtentCount], nil
}

func (s *session) close() {
	s.conn.CloseWithError(0, "")
}
