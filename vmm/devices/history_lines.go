package devices

import (
	"bytes"
	"context"
	"fmt"
	"strings"
)

// HistoryLines reads a History a line at a time (a serial console's
// output, for the tests and tools that wait on what a guest prints), woken
// by its subscription rather than polling.
type HistoryLines struct {
	h    *History
	sub  *Subscription
	off  uint64
	part []byte
}

// NewHistoryLines reads h's output from offset from on.
func NewHistoryLines(h *History, from uint64) *HistoryLines {
	return &HistoryLines{h: h, sub: h.Subscribe(), off: from}
}

// NextLine returns the next complete line without its line ending ("\n"
// or "\r\n"), waiting for it until ctx ends. Output the history dropped before it
// was read (its ring buffer wrapped) is skipped.
func (l *HistoryLines) NextLine(ctx context.Context) (string, error) {
	for {
		if i := bytes.IndexByte(l.part, '\n'); i >= 0 {
			line := strings.TrimRight(string(l.part[:i]), "\r")
			l.part = l.part[i+1:]
			return line, nil
		}
		data, _, next, err := l.h.ReadFrom(l.off, 1<<16)
		if err != nil {
			return "", fmt.Errorf("reading serial output: %w", err)
		}
		l.off = next
		if len(data) > 0 {
			l.part = append(l.part, data...)
			continue
		}
		select {
		case <-l.sub.C():
		case <-ctx.Done():
			return "", context.Cause(ctx)
		}
	}
}

// Close unsubscribes from the history.
func (l *HistoryLines) Close() { l.sub.Close() }
