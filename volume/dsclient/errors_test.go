package dsclient

import (
	"errors"
	"testing"

	"tern/volume"
	"tern/volume/wire"
)

// The EC volume reports Error's own wording (after "shard N (target): "),
// so it is the text its status and activation errors have always shown.
func TestErrorWording(t *testing.T) {
	io := errors.New("stream reset")
	refused := (&wire.Error{Code: wire.CodeGenTooLow, Message: "generation 3 is not above 4"}).Err()
	tests := []struct {
		err  *Error
		want string
	}{
		{&Error{Step: StepStream, Failure: FailSend, Err: io}, "opening session stream: stream reset"},
		{&Error{Step: StepHello, Failure: FailSend, Err: io}, "sending hello: stream reset"},
		{&Error{Step: StepHello, Failure: FailReceive, Err: io}, "reading hello reply: stream reset"},
		{&Error{Step: StepHello, Failure: FailUnexpected, Got: wire.TypeAck}, "hello answered with " + wire.TypeAck.String()},
		{&Error{Step: StepActivate, Failure: FailSend, Err: io}, "sending activate: stream reset"},
		{&Error{Step: StepActivate, Failure: FailReceive, Err: io}, "reading activation reply: stream reset"},
		{&Error{Step: StepActivate, Failure: FailFenced, ByGen: 9, Err: volume.ErrFenced}, "activated by generation 9: " + volume.ErrFenced.Error()},
		{&Error{Step: StepActivate, Failure: FailRefused, Gen: 3, Code: wire.CodeGenTooLow, Err: refused},
			volume.ErrGenTooLow.Error() + ": generation 3 refused: " + refused.Error()},
		{&Error{Step: StepActivate, Failure: FailUnexpected, Got: wire.TypeAck}, "activation answered with " + wire.TypeAck.String()},
		{&Error{Step: StepExtentVersions, Failure: FailSend, Err: io}, "asking for extent versions: stream reset"},
		{&Error{Step: StepExtentVersions, Failure: FailReceive, Err: io}, "reading extent versions: stream reset"},
		{&Error{Step: StepExtentVersions, Failure: FailUnexpected, Got: wire.TypeAck}, "extent versions answered with " + wire.TypeAck.String()},
	}
	for _, tt := range tests {
		if got := tt.err.Error(); got != tt.want {
			t.Errorf("Error() = %q, want %q", got, tt.want)
		}
	}
}

func TestRefusalsMatchTheVolumeErrorTheirCodeMeans(t *testing.T) {
	tests := []struct {
		step Step
		code wire.ErrorCode
		want error
	}{
		{StepHello, wire.CodeRegionMismatch, volume.ErrRegionMismatch},
		{StepActivate, wire.CodeFenced, volume.ErrFenced},
		{StepActivate, wire.CodeGenTooLow, volume.ErrGenTooLow},
		{StepHello, wire.CodeGenTooLow, nil},
		{StepActivate, wire.CodeRegionMismatch, nil},
	}
	for _, tt := range tests {
		cause := (&wire.Error{Code: tt.code, Message: "no"}).Err()
		e := &Error{Step: tt.step, Failure: FailRefused, Code: tt.code, Err: cause}
		if got := e.Sentinel(); got != tt.want {
			t.Errorf("%v refused with %v: sentinel %v, want %v", tt.step, tt.code, got, tt.want)
		}
		if !errors.Is(e, cause) {
			t.Errorf("%v refused with %v: does not match its cause", tt.step, tt.code)
		}
	}
}
