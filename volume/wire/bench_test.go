package wire

import (
	"testing"
)

// loopReader replays one byte stream forever, so decoding benchmarks
// measure the decoder rather than a reader.
type loopReader struct {
	b   []byte
	off int
}

func (r *loopReader) Read(p []byte) (int, error) {
	n := copy(p, r.b[r.off:])
	r.off = (r.off + n) % len(r.b)
	return n, nil
}

func writeFrame(size int) []byte {
	m := &Write{JobID: 1000, Deps: []JobID{998, 999}, Hashes: make([]uint64, size/4096), Data: make([]byte, size)}
	frame, data, err := AppendFrame(nil, m)
	if err != nil {
		panic(err)
	}
	return append(frame, data...)
}

func TestSteadyStateEncodeDecodeDoesNotAllocate(t *testing.T) {
	msgs := sampleMessages()
	enc := NewEncoder(discard{})
	var stream []byte
	for _, m := range msgs {
		f, d, _ := AppendFrame(nil, m)
		stream = append(append(stream, f...), d...)
	}
	dec := NewDecoder(&loopReader{b: stream})
	guest := make([]byte, 1<<20)
	dec.DataBuffer = func(MsgType, JobID, int) []byte { return guest }
	round := func() {
		for _, m := range msgs {
			if m.Type() == TypeError {
				continue // its Message string is allocated by design
			}
			if err := enc.Encode(m); err != nil {
				t.Fatal(err)
			}
		}
		for range msgs {
			if _, err := dec.Next(); err != nil {
				t.Fatal(err)
			}
		}
	}
	round() // grow buffers
	if a := testing.AllocsPerRun(20, round); a > 1 {
		t.Fatalf("%.1f allocations per round of every message, want at most 1 (the Error string)", a)
	}
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

func BenchmarkEncodeWrite1MiB(b *testing.B) {
	m := &Write{JobID: 1000, Deps: []JobID{998, 999}, Hashes: make([]uint64, 256), Data: make([]byte, 1<<20)}
	enc := NewEncoder(discard{})
	b.ReportAllocs()
	b.SetBytes(int64(len(m.Data)))
	for b.Loop() {
		m.JobID++
		if err := enc.Encode(m); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeWrite1MiB(b *testing.B) {
	dec := NewDecoder(&loopReader{b: writeFrame(1 << 20)})
	buf := make([]byte, 1<<20)
	dec.DataBuffer = func(MsgType, JobID, int) []byte { return buf }
	b.ReportAllocs()
	b.SetBytes(1 << 20)
	for b.Loop() {
		if _, err := dec.Next(); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeWrite4KiB(b *testing.B) {
	dec := NewDecoder(&loopReader{b: writeFrame(4096)})
	buf := make([]byte, 4096)
	dec.DataBuffer = func(MsgType, JobID, int) []byte { return buf }
	b.ReportAllocs()
	b.SetBytes(4096)
	for b.Loop() {
		if _, err := dec.Next(); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkEncodeAck(b *testing.B) {
	enc := NewEncoder(discard{})
	m := &Ack{}
	b.ReportAllocs()
	for b.Loop() {
		m.JobID++
		if err := enc.Encode(m); err != nil {
			b.Fatal(err)
		}
	}
}
