package devices

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestHistoryLinesSplitsWhatTheUARTWrote drives the UART's registers as a
// guest does (its transmit register), the bytes arriving in pieces.
func TestHistoryLinesSplitsWhatTheUARTWrote(t *testing.T) {
	u := NewUART(NewHistory(1<<10), NoInterrupt{})
	l := NewHistoryLines(u.Output(), 0)
	defer l.Close()
	got := make(chan string, 4)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for range 3 {
			line, err := l.NextLine(ctx)
			if err != nil {
				line = "error: " + err.Error()
			}
			got <- line
		}
	}()
	for _, b := range []byte("one\r\ntw") {
		u.WritePort(UARTBase, []byte{b})
	}
	if line := <-got; line != "one" {
		t.Fatalf("first line %q", line)
	}
	for _, b := range []byte("o\n\r\n") {
		u.WritePort(UARTBase, []byte{b})
	}
	for _, want := range []string{"two", ""} {
		if line := <-got; line != want {
			t.Fatalf("line %q, want %q", line, want)
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if _, err := l.NextLine(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("NextLine with nothing written = %v, want the context's deadline", err)
	}
}
