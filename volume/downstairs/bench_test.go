package downstairs

import (
	"context"
	"io"
	"testing"

	"tern/internal/tlsconf/tlstest"
	"tern/volume/extent"
	"tern/volume/ids"
	"tern/volume/transport"
	"tern/volume/wire"
)

const benchExtentBlocks = 4096 // 16 MiB extents

func benchServer(b *testing.B) *testServer {
	dir := b.TempDir()
	spec := extent.NewSpec(testBlockSize, benchExtentBlocks, 4)
	if err := Create(dir, spec); err != nil {
		b.Fatal(err)
	}
	return startServer(b, dir)
}

// pipeline keeps depth requests in flight until b.N have completed; mk
// builds request i.
func pipeline(b *testing.B, c *client, depth int, mk func(i int) wire.Message) {
	credits := make(chan struct{}, depth)
	errs := make(chan string, 1)
	go func() {
		for i := 0; i < b.N; i++ {
			credits <- struct{}{}
			if err := c.enc.Encode(mk(i)); err != nil {
				errs <- err.Error()
				return
			}
		}
	}()
	for range b.N {
		select {
		case m := <-c.msgs:
			switch m.(type) {
			case *wire.Ack, *wire.ReadResponse:
			default:
				b.Fatalf("unexpected %s", describe(m))
			}
		case e := <-errs:
			b.Fatal(e)
		}
		<-credits
	}
}

func benchWrite(b *testing.B, size, depth int) {
	ts := benchServer(b)
	c := dial(b, ts.addr(), false)
	c.mustActivate(1)
	n := size / testBlockSize
	data, hashes := blocks(n, 1)
	slots := benchExtentBlocks * 4 / n
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	pipeline(b, c, depth, func(i int) wire.Message {
		return &wire.Write{JobID: wire.JobID(10000 + i), Offset: ids.BlockIndex((i % slots) * n), Hashes: hashes, Data: data}
	})
}

func benchRead(b *testing.B, size, depth int) {
	ts := benchServer(b)
	c := dial(b, ts.addr(), false)
	c.mustActivate(1)
	n := size / testBlockSize
	data, _ := blocks(n, 1)
	slots := benchExtentBlocks * 4 / n
	for i := range slots {
		c.mustWrite(ids.BlockIndex(i*n), data)
	}
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	pipeline(b, c, depth, func(i int) wire.Message {
		return &wire.Read{JobID: wire.JobID(10000 + i), Offset: ids.BlockIndex((i % slots) * n), Count: uint32(n)}
	})
}

// BenchmarkWrite1MiBQD32 measures 1 MiB writes at queue depth 32 through
// real QUIC on loopback into a real region (page cache, no flush).
func BenchmarkWrite1MiBQD32(b *testing.B) { benchWrite(b, 1<<20, 32) }

// BenchmarkWrite4KiBQD32 measures small-write IOPS at queue depth 32.
func BenchmarkWrite4KiBQD32(b *testing.B) { benchWrite(b, 4096, 32) }

// BenchmarkWrite4KiBQD1 measures one small write's round trip.
func BenchmarkWrite4KiBQD1(b *testing.B) { benchWrite(b, 4096, 1) }

// BenchmarkRead1MiBQD32 measures 1 MiB reads at queue depth 32.
func BenchmarkRead1MiBQD32(b *testing.B) { benchRead(b, 1<<20, 32) }

// BenchmarkQUICStreamLimit is the limit the write benchmarks compare
// against: 1 MiB chunks pushed down one QUIC stream on loopback with the
// same configuration, and discarded by the receiver.
func BenchmarkQUICStreamLimit(b *testing.B) {
	ln, err := transport.Listen("127.0.0.1:0", tlstest.Shared(b).ServerConfig())
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	received := make(chan int64, 1)
	go func() {
		conn, err := ln.Accept(ctx)
		if err != nil {
			received <- 0
			return
		}
		s, err := conn.AcceptStream(ctx)
		if err != nil {
			received <- 0
			return
		}
		n, _ := io.Copy(io.Discard, s)
		received <- n
	}()
	conn, err := transport.Dial(ctx, ln.Addr().String(), tlstest.Shared(b).ClientConfig("127.0.0.1"))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.CloseWithError(0, "")
	s, err := conn.OpenStreamSync(ctx)
	if err != nil {
		b.Fatal(err)
	}
	chunk := make([]byte, 1<<20)
	b.SetBytes(int64(len(chunk)))
	b.ResetTimer()
	for range b.N {
		if _, err := s.Write(chunk); err != nil {
			b.Fatal(err)
		}
	}
	s.Close()
	if n := <-received; n != int64(b.N)*int64(len(chunk)) {
		b.Fatalf("received %d bytes", n)
	}
}

// BenchmarkJobPathWrite4KiB measures the downstairs' own per-write work
// without QUIC: job from a decoded Write, engine admission and completion,
// the region write, the Ack encoding and the job's release. It must not
// allocate.
func BenchmarkJobPathWrite4KiB(b *testing.B) {
	dir := b.TempDir()
	spec := extent.NewSpec(testBlockSize, benchExtentBlocks, 1)
	region, err := extent.Create(dir, spec)
	if err != nil {
		b.Fatal(err)
	}
	defer region.Close()
	srv := NewServer(region, Config{})
	s := &session{srv: srv, eng: newEngine()}
	srv.fence.active = s
	enc := wire.NewEncoder(io.Discard)
	var out replyEncoder
	data, hashes := blocks(1, 1)
	msg := &wire.Write{Deps: []wire.JobID{1}, Hashes: hashes, Data: data}
	b.SetBytes(testBlockSize)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		msg.JobID = wire.JobID(i + 2)
		msg.Offset = ids.BlockIndex(i % benchExtentBlocks)
		buf := srv.bufs.get(len(data))
		copy(*buf, data) // stands in for the decoder filling the buffer
		j := s.toJob(msg, buf)
		if run, _ := s.eng.submit(j.key(spec)); !run {
			b.Fatal("job not runnable")
		}
		j.execute(srv)
		s.eng.complete(j.id)
		if err := out.encode(enc, j, spec); err != nil || j.failed {
			b.Fatal(err, j.errMsg)
		}
		j.release(&srv.bufs)
	}
}
