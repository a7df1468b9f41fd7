package testwait

import (
	"bytes"
	"runtime"
	"strconv"
	"testing"
	"time"
)

// Goroutines is the set of goroutines that ran when it was taken.
// Goroutine ids are never reused, so a goroutine absent from it started
// later: comparing sets tells a goroutine that has not returned from one
// that ended while another started, which comparing counts cannot.
type Goroutines struct {
	ids map[uint64]bool
}

// Running returns the goroutines that run now.
func Running() Goroutines {
	g := Goroutines{ids: map[uint64]bool{}}
	for _, s := range stacks() {
		g.ids[s.id] = true
	}
	return g
}

// Returned waits until every goroutine started since g was taken (but
// the caller's own) has returned; after timeout it fails t with their
// stacks. Closing a connection or a server lets its goroutines end
// asynchronously; this waits for them to be gone, not for a count.
func (g Goroutines) Returned(t testing.TB, timeout time.Duration) {
	t.Helper()
	var left []stack
	if Poll(timeout, func() bool { left = g.started(); return len(left) == 0 }) {
		return
	}
	var b bytes.Buffer
	for _, s := range left {
		b.Write(s.text)
		b.WriteString("\n\n")
	}
	t.Fatalf("%d goroutines started during the test have not returned after %v:\n%s", len(left), timeout, b.Bytes())
}

// started lists the goroutines, but the calling one, not in g.
func (g Goroutines) started() []stack {
	all := stacks()
	var out []stack
	for i, s := range all {
		if i > 0 && !g.ids[s.id] { // the first stack is the caller's
			out = append(out, s)
		}
	}
	return out
}

// stack is one goroutine of a runtime.Stack dump.
type stack struct {
	id   uint64
	text []byte
}

// stacks dumps every goroutine, the caller's first, as runtime.Stack
// prints them: "goroutine N [state]:" then frames, blank-line separated.
func stacks() []stack {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var out []stack
	for _, text := range bytes.Split(buf, []byte("\n\n")) {
		rest, ok := bytes.CutPrefix(text, []byte("goroutine "))
		if !ok {
			continue
		}
		idText, _, _ := bytes.Cut(rest, []byte(" "))
		id, err := strconv.ParseUint(string(idText), 10, 64)
		if err != nil {
			continue
		}
		out = append(out, stack{id: id, text: text})
	}
	return out
}
