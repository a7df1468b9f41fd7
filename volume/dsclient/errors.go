package dsclient

import (
	"errors"
	"fmt"

	"tern/volume"
	"tern/volume/ids"
	"tern/volume/wire"
)

var (
	errFenced     = volume.ErrFenced
	errNotRequest = errors.New("not a request sent by job id")
)

// Step is the part of a session a failure happened in.
type Step uint8

// The steps of a session, in order.
const (
	// StepStream: opening the session stream.
	StepStream Step = iota + 1
	// StepHello: the Hello and its reply.
	StepHello
	// StepActivate: the Activate and its reply.
	StepActivate
	// StepExtentVersions: reading every extent's version.
	StepExtentVersions
	// StepCall: a Call (Error.Req is its request).
	StepCall
)

// Failure is how a step failed.
type Failure uint8

// The ways a step fails.
const (
	// FailSend: the request could not be sent (the stream could not be
	// opened); Err is why.
	FailSend Failure = iota + 1
	// FailReceive: no reply could be read; Err is why.
	FailReceive
	// FailRefused: the downstairs answered with an Error; Code is its
	// code and Err its error (a *wire.RemoteError).
	FailRefused
	// FailFenced: the downstairs answered Activate with Fenced: a higher
	// generation (ByGen) activated it. Err is volume.ErrFenced.
	FailFenced
	// FailUnexpected: the reply (of type Got) is not the step's answer.
	FailUnexpected
	// FailMismatch: a Call's reply (of type Got) answers another job.
	FailMismatch
)

// Error is a failed step of a session.
type Error struct {
	Step    Step
	Failure Failure
	// Req is a Call's request type.
	Req wire.MsgType
	// Got is the type of the reply, when one came.
	Got wire.MsgType
	// Code is a refusal's error code.
	Code wire.ErrorCode
	// Gen is the generation Activate asked for; ByGen the one that
	// fenced it.
	Gen, ByGen ids.Generation
	// Err is the cause: the transport's error, the downstairs' error or
	// volume.ErrFenced (see Failure).
	Err error
}

// Sentinel is the volume error a refusal means (volume.ErrRegionMismatch
// for a Hello refused with CodeRegionMismatch, volume.ErrFenced or
// volume.ErrGenTooLow for an Activate refused with CodeFenced or
// CodeGenTooLow), or nil.
func (e *Error) Sentinel() error {
	if e.Failure != FailRefused {
		return nil
	}
	switch {
	case e.Step == StepHello && e.Code == wire.CodeRegionMismatch:
		return volume.ErrRegionMismatch
	case e.Step == StepActivate && e.Code == wire.CodeFenced:
		return volume.ErrFenced
	case e.Step == StepActivate && e.Code == wire.CodeGenTooLow:
		return volume.ErrGenTooLow
	}
	return nil
}

// Unwrap returns the sentinel a refusal means, if any, and the cause.
func (e *Error) Unwrap() []error {
	var errs []error
	if s := e.Sentinel(); s != nil {
		errs = append(errs, s)
	}
	if e.Err != nil {
		errs = append(errs, e.Err)
	}
	return errs
}

// Error words the failure without naming the downstairs (its user adds
// which one): "<sentinel>: " first when a refusal means one.
func (e *Error) Error() string {
	msg := e.describe()
	if s := e.Sentinel(); s != nil {
		return s.Error() + ": " + msg
	}
	return msg
}

func (e *Error) describe() string {
	switch e.Failure {
	case FailSend:
		switch e.Step {
		case StepStream:
			return fmt.Sprintf("opening session stream: %v", e.Err)
		case StepHello:
			return fmt.Sprintf("sending hello: %v", e.Err)
		case StepActivate:
			return fmt.Sprintf("sending activate: %v", e.Err)
		case StepExtentVersions:
			return fmt.Sprintf("asking for extent versions: %v", e.Err)
		}
		return fmt.Sprintf("sending %v: %v", e.Req, e.Err)
	case FailReceive:
		switch e.Step {
		case StepHello:
			return fmt.Sprintf("reading hello reply: %v", e.Err)
		case StepActivate:
			return fmt.Sprintf("reading activation reply: %v", e.Err)
		case StepExtentVersions:
			return fmt.Sprintf("reading extent versions: %v", e.Err)
		}
		return fmt.Sprintf("reading reply to %v: %v", e.Req, e.Err)
	case FailRefused:
		switch e.Step {
		case StepHello:
			return fmt.Sprintf("hello refused: %v", e.Err)
		case StepActivate:
			return fmt.Sprintf("generation %d refused: %v", e.Gen, e.Err)
		}
		return fmt.Sprintf("%v refused: %v", e.Req, e.Err)
	case FailFenced:
		return fmt.Sprintf("activated by generation %d: %v", e.ByGen, e.Err)
	case FailMismatch:
		return fmt.Sprintf("%v answered with %v of another job", e.Req, e.Got)
	}
	return fmt.Sprintf("%s answered with %v", e.Step, e.Got)
}

// String names the step as the errors do.
func (s Step) String() string {
	switch s {
	case StepStream:
		return "session stream"
	case StepHello:
		return "hello"
	case StepActivate:
		return "activation"
	case StepExtentVersions:
		return "extent versions"
	case StepCall:
		return "call"
	}
	return fmt.Sprintf("step(%d)", uint8(s))
}
