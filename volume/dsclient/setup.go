package dsclient

import (
	"context"

	"github.com/google/uuid"

	"tern/volume/ids"
	"tern/volume/wire"
)

// Job ids of the setup's requests, below every id a session's IO uses.
const (
	ActivateJobID wire.JobID = 1
	VersionsJobID wire.JobID = 2
)

// HelloParams is who a session says it is.
type HelloParams struct {
	// RegionUUID is the region expected; uuid.Nil accepts any (a
	// downstairs serving another refuses the Hello).
	RegionUUID uuid.UUID
	// UpstairsID identifies the client.
	UpstairsID uuid.UUID
	// ReadOnly asks for a session that never activates, writes or fences.
	ReadOnly bool
}

// Hello opens the session with a fresh session id and returns the region
// the downstairs serves. A refusal is an *Error of FailRefused (matching
// volume.ErrRegionMismatch when the region is not the one expected).
func (c *Conn) Hello(p HelloParams) (wire.RegionInfo, error) {
	hello := &wire.Hello{Versions: wire.SupportedVersions, RegionUUID: p.RegionUUID, ReadOnly: p.ReadOnly,
		UpstairsID: p.UpstairsID, SessionID: uuid.New()}
	if err := c.Send(hello); err != nil {
		return wire.RegionInfo{}, &Error{Step: StepHello, Failure: FailSend, Err: err}
	}
	m, err := c.reply()
	if err != nil {
		return wire.RegionInfo{}, &Error{Step: StepHello, Failure: FailReceive, Err: err}
	}
	switch m := m.(type) {
	case *wire.HelloReply:
		c.sessionID = hello.SessionID
		return m.Region, nil
	case *wire.Error:
		return wire.RegionInfo{}, &Error{Step: StepHello, Failure: FailRefused, Got: m.Type(), Code: m.Code, Err: m.Err()}
	default:
		return wire.RegionInfo{}, &Error{Step: StepHello, Failure: FailUnexpected, Got: m.Type()}
	}
}

// Activate makes the session the region's writer at generation gen, after
// a Hello, and returns whether the downstairs may have lost unflushed
// writes (it restarted). If ctx has a deadline, the stream's deadline is
// set to it. A Fenced answer is an *Error of FailFenced; a refusal, of
// FailRefused (matching volume.ErrFenced or volume.ErrGenTooLow by its
// code).
func (c *Conn) Activate(ctx context.Context, upstairsID uuid.UUID, gen ids.Generation) (lostWrites bool, err error) {
	if d, ok := ctx.Deadline(); ok {
		_ = c.stream.SetDeadline(d)
	}
	fail := func(e *Error) (bool, error) {
		e.Step, e.Gen = StepActivate, gen
		return false, e
	}
	if err := c.Send(&wire.Activate{JobID: ActivateJobID, UpstairsID: upstairsID, SessionID: c.sessionID, Gen: gen}); err != nil {
		return fail(&Error{Failure: FailSend, Err: err})
	}
	m, err := c.reply()
	if err != nil {
		return fail(&Error{Failure: FailReceive, Err: err})
	}
	switch m := m.(type) {
	case *wire.ActivateAck:
		return m.LostWrites, nil
	case *wire.Fenced:
		return fail(&Error{Failure: FailFenced, Got: m.Type(), ByGen: m.ByGen, Err: errFenced})
	case *wire.Error:
		return fail(&Error{Failure: FailRefused, Got: m.Type(), Code: m.Code, Err: m.Err()})
	default:
		return fail(&Error{Failure: FailUnexpected, Got: m.Type()})
	}
}

// ExtentVersions reads the version of each of the region's extentCount
// extents after Activate, a frame at a time (the downstairs decides how
// many fit in one). A reply that is not the frame asked for is an
// *Error of FailUnexpected.
func (c *Conn) ExtentVersions(extentCount uint32) ([]wire.ExtentVersion, error) {
	// Grown as frames arrive, not sized by extentCount up front: the
	// count is the downstairs' word, which a layout may not have checked.
	var versions []wire.ExtentVersion
	for uint32(len(versions)) < extentCount {
		req := &wire.ExtentVersionsRequest{JobID: VersionsJobID, First: ids.ExtentID(len(versions))}
		if err := c.Send(req); err != nil {
			return nil, &Error{Step: StepExtentVersions, Failure: FailSend, Err: err}
		}
		m, err := c.reply()
		if err != nil {
			return nil, &Error{Step: StepExtentVersions, Failure: FailReceive, Err: err}
		}
		ev, ok := m.(*wire.ExtentVersions)
		if !ok || ev.First != req.First || len(ev.Versions) == 0 {
			return nil, &Error{Step: StepExtentVersions, Failure: FailUnexpected, Got: m.Type()}
		}
		versions = append(versions, ev.Versions...)
	}
	return versions[:extentCount], nil
}
