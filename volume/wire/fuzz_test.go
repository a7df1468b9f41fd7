package wire

import (
	"bytes"
	"errors"
	"io"
	"tern/volume/ids"
	"testing"
)

// FuzzDecodeFrame feeds arbitrary bytes to a Decoder. Decoding must never
// panic; every frame it accepts must re-encode to exactly the bytes it was
// decoded from (one encoding per message), and every failure must be one of
// the documented errors.
func FuzzDecodeFrame(f *testing.F) {
	for _, m := range sampleMessages() {
		frame, data, err := AppendFrame(nil, m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(append(frame, data...))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		r := &countingReader{r: bytes.NewReader(in)}
		dec := NewDecoder(r)
		useCaller := len(in)%2 == 0
		caller := make([]byte, 8192)
		if useCaller {
			dec.DataBuffer = func(_ MsgType, _ JobID, n int) []byte { return caller }
		}
		start := 0
		for {
			m, err := dec.Next()
			if err != nil {
				if err != io.EOF && !isDecodeError(err) {
					t.Fatalf("undocumented error: %v", err)
				}
				return
			}
			end := int(r.n) - dec.r.Buffered()
			frame, data, err := AppendFrame(nil, m)
			if err != nil {
				t.Fatalf("re-encoding decoded %v: %v", m.Type(), err)
			}
			if got := append(frame, data...); !bytes.Equal(got, in[start:end]) {
				t.Fatalf("%v re-encodes differently:\n in %x\nout %x", m.Type(), in[start:end], got)
			}
			start = end
		}
	})
}

func isDecodeError(err error) bool {
	for _, e := range []error{ErrBadMagic, ErrFrameTooLarge, ErrUnknownType, ErrMalformed, io.ErrUnexpectedEOF} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// FuzzRoundTripWrite builds Write frames from fuzzed fields and checks they
// decode to the same values.
func FuzzRoundTripWrite(f *testing.F) {
	f.Add(uint64(1), uint64(0), []byte{1, 2, 3, 4, 5, 6, 7, 8}, []byte("data"))
	f.Add(uint64(1<<63), uint64(1<<40), []byte{}, []byte{})
	f.Fuzz(func(t *testing.T, job, off uint64, rawDeps []byte, data []byte) {
		if len(data) > MaxDataSize {
			return
		}
		deps := make([]JobID, len(rawDeps)/8)
		for i := range deps {
			deps[i] = JobID(le.Uint64(rawDeps[8*i:]))
		}
		hashes := make([]uint64, len(data)%7)
		for i := range hashes {
			hashes[i] = uint64(i) * job
		}
		in := &Write{JobID: JobID(job), Deps: deps, Offset: ids.BlockIndex(off), Hashes: hashes, Data: data}
		frame, d, err := AppendFrame(nil, in)
		if err != nil {
			t.Fatal(err)
		}
		m, err := NewDecoder(bytes.NewReader(append(frame, d...))).Next()
		if err != nil {
			t.Fatal(err)
		}
		out := m.(*Write)
		if out.JobID != in.JobID || out.Offset != in.Offset || len(out.Deps) != len(deps) ||
			len(out.Hashes) != len(hashes) || !bytes.Equal(out.Data, data) {
			t.Fatalf("round trip: got %+v want %+v", out, in)
		}
	})
}
