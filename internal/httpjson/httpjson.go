package httpjson

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
)

// CodeInternalError is the error code of an answer that could not be
// encoded.
const CodeInternalError = "internal_error"

// Error is the body of every error answer: a code clients branch on and
// a message for people.
type Error struct {
	ErrorCode string `json:"error_code"`
	Message   string `json:"message"`
}

// Write answers with status and v as JSON, followed by a newline. A value
// that cannot be encoded is answered as a 500 with an Error instead, so a
// client never receives half a body.
func Write(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b, _ = json.Marshal(Error{ErrorCode: CodeInternalError, Message: "encoding response: " + err.Error()})
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}

// WriteError answers with status and an Error of code and msg.
func WriteError(w http.ResponseWriter, status int, code, msg string) {
	Write(w, status, Error{ErrorCode: code, Message: msg})
}

// ErrTrailingData is Decode's error for a body with more after its JSON
// value.
var ErrTrailingData = errors.New("data after the JSON object")

// Decode reads one JSON value from r into v strictly: a field v does not
// have is an error, and so is anything but white space after the value.
func Decode(r io.Reader, v any) error {
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return ErrTrailingData
	}
	return nil
}

// DecodeRequest is Decode of r's body, of which it reads at most limit
// bytes; its error says "decoding body".
func DecodeRequest(r *http.Request, limit int64, v any) error {
	if err := Decode(http.MaxBytesReader(nil, r.Body, limit), v); err != nil {
		return fmt.Errorf("decoding body: %w", err)
	}
	return nil
}
