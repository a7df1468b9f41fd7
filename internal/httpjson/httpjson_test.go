package httpjson

import (
	"context"
	"errors"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestWriteIsTheValueAndANewline(t *testing.T) {
	rec := httptest.NewRecorder()
	Write(rec, http.StatusCreated, map[string]string{"a": "<b>"})
	if rec.Code != http.StatusCreated || rec.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("status %d, content type %q", rec.Code, rec.Header().Get("Content-Type"))
	}
	if got, want := rec.Body.String(), `{"a":"\u003cb\u003e"}`+"\n"; got != want {
		t.Fatalf("body %q; want %q", got, want)
	}
}

func TestWriteAnswersAnUnencodableValueWith500(t *testing.T) {
	rec := httptest.NewRecorder()
	Write(rec, http.StatusOK, math.NaN())
	if rec.Code != http.StatusInternalServerError || !strings.HasPrefix(rec.Body.String(), `{"error_code":"internal_error","message":"encoding response: `) {
		t.Fatalf("status %d body %q", rec.Code, rec.Body.String())
	}
}

func TestWriteErrorBody(t *testing.T) {
	rec := httptest.NewRecorder()
	WriteError(rec, http.StatusNotFound, "not_found", "no route GET /x")
	if got, want := rec.Body.String(), `{"error_code":"not_found","message":"no route GET /x"}`+"\n"; rec.Code != 404 || got != want {
		t.Fatalf("status %d body %q; want 404 %q", rec.Code, got, want)
	}
}

func TestDecodeIsStrict(t *testing.T) {
	type body struct {
		A int `json:"a"`
	}
	for _, tc := range []struct {
		in      string
		wantErr bool
	}{
		{`{"a":1}`, false},
		{"{\"a\":1}\n  ", false},
		{`{"a":1,"b":2}`, true},
		{`{"a":1} {"a":2}`, true},
		{`{"a":1} x`, true},
		{`{"a":`, true},
	} {
		var b body
		if err := Decode(strings.NewReader(tc.in), &b); (err != nil) != tc.wantErr {
			t.Errorf("Decode(%q) = %v; want error %v", tc.in, err, tc.wantErr)
		}
	}
	var b body
	if err := Decode(strings.NewReader(`{"a":1}x`), &b); !errors.Is(err, ErrTrailingData) {
		t.Errorf("trailing data: %v", err)
	}
}

func TestDecodeRequestLimitsTheBody(t *testing.T) {
	r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(`{"a":"`+strings.Repeat("x", 100)+`"}`))
	var v struct {
		A string `json:"a"`
	}
	err := DecodeRequest(r, 50, &v)
	var tooBig *http.MaxBytesError
	if !errors.As(err, &tooBig) || !strings.HasPrefix(err.Error(), "decoding body: ") {
		t.Fatalf("err %v; want a MaxBytesError saying decoding body", err)
	}
}

func TestAfterGen(t *testing.T) {
	for _, tc := range []struct {
		query  string
		gen    uint64
		wantOK bool
	}{{"", 0, true}, {"?after_gen=7", 7, true}, {"?after_gen=x", 0, false}, {"?after_gen=-1", 0, false}} {
		gen, ok := AfterGen(httptest.NewRequest(http.MethodGet, "/v"+tc.query, nil))
		if gen != tc.gen || ok != tc.wantOK {
			t.Errorf("%q: %d %v; want %d %v", tc.query, gen, ok, tc.gen, tc.wantOK)
		}
	}
}

func TestGenerationWaitAfterWakesOnAdvance(t *testing.T) {
	g := NewGeneration(1)
	if n, ok := g.WaitAfter(context.Background(), 0); n != 1 || !ok {
		t.Fatalf("WaitAfter(0) = %d %v; want 1 at once", n, ok)
	}
	got := make(chan uint64)
	go func() {
		n, _ := g.WaitAfter(context.Background(), 1)
		got <- n
	}()
	g.Advance()
	select {
	case n := <-got:
		if n != 2 {
			t.Fatalf("woke with %d; want 2", n)
		}
	case <-time.After(time.Minute):
		t.Fatal("WaitAfter(1) did not wake on Advance within a minute")
	}
}

func TestGenerationWaitAfterEndsWithItsContext(t *testing.T) {
	g := NewGeneration(3)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if n, ok := g.WaitAfter(ctx, 3); n != 3 || ok {
		t.Fatalf("WaitAfter with an ended context = %d %v; want 3 false", n, ok)
	}
}
