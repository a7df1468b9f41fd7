package nbd

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"path/filepath"
	"testing"

	"tern/internal/tlsconf"
)

func TestInfoReportsSizeFlagsAndBlockSizes(t *testing.T) {
	for _, ro := range []bool{false, true} {
		_, addr := startServer(t, newMemDevice(testSize), func(c *Config) { c.Export.ReadOnly = ro })
		rc := dial(t, addr)
		if typ := rc.goOrInfo(optInfo, "vol"); typ != repAck {
			t.Fatalf("NBD_OPT_INFO: reply %#x", typ)
		}
		want := FlagHasFlags | FlagSendFlush | FlagCanMultiConn
		if ro {
			want |= FlagReadOnly
		} else {
			want |= FlagSendFUA | FlagSendTrim | FlagSendWriteZeroes
		}
		got := rc.info
		if got.size != testSize || got.flags != want || got.minBS != testBlockSize || got.prefBS != 4096 || got.maxBS != MaxRequestBytes {
			t.Errorf("read-only %v: info %+v, want size %d flags %#x block sizes %d/4096/%d", ro, got, testSize, want, testBlockSize, MaxRequestBytes)
		}
		// INFO leaves the client in negotiation: GO still works.
		if typ := rc.goOrInfo(optGo, "vol"); typ != repAck {
			t.Fatalf("NBD_OPT_GO after INFO: reply %#x", typ)
		}
	}
}

func TestListAbortAndUnknownOptions(t *testing.T) {
	_, addr := startServer(t, newMemDevice(testSize), nil)
	rc := dial(t, addr)
	rc.option(optList, nil)
	typ, data := rc.optReply(optList)
	if typ != repServer || !bytes.Equal(data, serverListData("vol")) {
		t.Fatalf("NBD_OPT_LIST: %#x %q", typ, data)
	}
	if typ, _ := rc.optReply(optList); typ != repAck {
		t.Fatalf("NBD_OPT_LIST ends with %#x, want ACK", typ)
	}
	rc.option(optList, []byte("x"))
	if typ, _ := rc.optReply(optList); typ != repErrInvalid {
		t.Errorf("NBD_OPT_LIST with data: %#x, want ERR_INVALID", typ)
	}
	rc.option(42, []byte("whatever"))
	if typ, _ := rc.optReply(42); typ != repErrUnsup {
		t.Errorf("option 42: %#x, want ERR_UNSUP", typ)
	}
	if typ := rc.goOrInfo(optGo, "nope"); typ != repErrUnknown {
		t.Errorf("NBD_OPT_GO for an unknown export: %#x, want ERR_UNKNOWN", typ)
	}
	rc.option(optStartTLS, nil)
	if typ, _ := rc.optReply(optStartTLS); typ != repErrUnsup {
		t.Errorf("STARTTLS without TLS configured: %#x, want ERR_UNSUP", typ)
	}
	rc.ack(optAbort)
	rc.expectClosed()
}

// TestRepliesGoOutAsRequestsComplete holds one read in the device and
// checks that a later request on the same connection is answered first.
func TestRepliesGoOutAsRequestsComplete(t *testing.T) {
	dev := newMemDevice(testSize)
	dev.gateOff, dev.gate, dev.entered = 0, make(chan struct{}), make(chan int64, 16)
	_, addr := startServer(t, dev, nil)
	rc := open(t, addr, false)
	rc.send(request{cmd: cmdRead, cookie: 1, offset: 0, length: 4096}, nil)
	if off := <-dev.entered; off != 0 {
		t.Fatalf("first call at %d", off)
	}
	rc.send(request{cmd: cmdRead, cookie: 2, offset: 8192, length: 4096}, nil)
	lens := func(uint64) int { return 4096 }
	if cookie, errno, _ := rc.simpleReply(lens); cookie != 2 || errno != 0 {
		t.Fatalf("first reply: cookie %d errno %d, want 2 and 0", cookie, errno)
	}
	close(dev.gate)
	if cookie, errno, _ := rc.simpleReply(lens); cookie != 1 || errno != 0 {
		t.Fatalf("second reply: cookie %d errno %d, want 1 and 0", cookie, errno)
	}
}

func TestWriteReadFlushRoundTrip(t *testing.T) {
	for _, structured := range []bool{false, true} {
		dev := newMemDevice(testSize)
		_, addr := startServer(t, dev, nil)
		rc := open(t, addr, structured)
		data := bytes.Repeat([]byte("tern"), 2048) // 8 KiB
		ok := func(n int) {
			t.Helper()
			for range n {
				if structured {
					if c := rc.chunk(); c.typ != replyNone || c.flags != replyFlagDone {
						t.Fatalf("chunk %+v, want NONE with DONE", c)
					}
				} else if _, errno, _ := rc.simpleReply(nil); errno != 0 {
					t.Fatalf("errno %d", errno)
				}
			}
		}
		// Requests in flight together are unordered: the zeroing
		// follows the write's reply.
		rc.send(request{cmd: cmdWrite, flags: cmdFlagFUA, cookie: 7, offset: 4096, length: uint32(len(data))}, data)
		ok(1)
		rc.send(request{cmd: cmdWriteZeroes, cookie: 8, offset: 4096, length: 4096}, nil)
		rc.send(request{cmd: cmdTrim, cookie: 9, offset: 0, length: 4096}, nil)
		rc.send(request{cmd: cmdFlush, cookie: 10}, nil)
		ok(3)
		want := append(make([]byte, 4096), data[4096:]...)
		if got := dev.bytes(4096, 8192); !bytes.Equal(got, want) {
			t.Fatalf("device holds the wrong bytes")
		}
		rc.send(request{cmd: cmdRead, cookie: 11, offset: 4096, length: 8192}, nil)
		var got []byte
		if structured {
			c := rc.chunk()
			if c.typ != replyOffsetData || c.flags != replyFlagDone || c.cookie != 11 || binary.BigEndian.Uint64(c.payload) != 4096 {
				t.Fatalf("read chunk %+v", c)
			}
			got = c.payload[8:]
		} else {
			_, _, got = rc.simpleReply(func(uint64) int { return 8192 })
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("read back the wrong bytes")
		}
		dev.mu.Lock()
		flushes := dev.flushes
		dev.mu.Unlock()
		if flushes != 2 {
			t.Errorf("%d device flushes, want 2 (FUA and FLUSH)", flushes)
		}
	}
}

// TestBadRequestsGetTheirErrno sends requests the export cannot serve:
// each gets its errno and the connection carries on.
func TestBadRequestsGetTheirErrno(t *testing.T) {
	cases := []struct {
		name     string
		r        request
		payload  int
		readOnly bool
		want     Errno
	}{
		{"misaligned read", request{cmd: cmdRead, offset: 512, length: 4096}, 0, false, EINVAL},
		{"short read", request{cmd: cmdRead, offset: 0, length: 100}, 0, false, EINVAL},
		{"read past the end", request{cmd: cmdRead, offset: testSize, length: 4096}, 0, false, EINVAL},
		{"read wrapping around", request{cmd: cmdRead, offset: 1<<64 - 4096, length: 8192}, 0, false, EINVAL},
		{"write past the end", request{cmd: cmdWrite, offset: testSize - 4096, length: 8192}, 8192, false, ENOSPC},
		{"zeroes past the end", request{cmd: cmdWriteZeroes, offset: testSize, length: 4096}, 0, false, ENOSPC},
		{"misaligned write", request{cmd: cmdWrite, offset: 100, length: 4096}, 4096, false, EINVAL},
		{"write to a read-only export", request{cmd: cmdWrite, offset: 0, length: 4096}, 4096, true, EPERM},
		{"trim on a read-only export", request{cmd: cmdTrim, offset: 0, length: 4096}, 0, true, EPERM},
		{"unknown command", request{cmd: 99}, 0, false, EINVAL},
		{"unknown flag", request{cmd: cmdRead, flags: 1 << 9, length: 4096}, 0, false, EINVAL},
		{"flush with a length", request{cmd: cmdFlush, length: 4096}, 0, false, EINVAL},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dev := newMemDevice(testSize)
			_, addr := startServer(t, dev, func(c *Config) { c.Export.ReadOnly = tc.readOnly })
			rc := open(t, addr, false)
			tc.r.cookie = 5
			rc.send(tc.r, make([]byte, tc.payload))
			if cookie, errno, _ := rc.simpleReply(nil); cookie != 5 || errno != tc.want {
				t.Fatalf("cookie %d errno %d, want 5 and %d", cookie, errno, tc.want)
			}
			// The connection carries on.
			rc.send(request{cmd: cmdRead, cookie: 6, length: 4096}, nil)
			if cookie, errno, _ := rc.simpleReply(func(uint64) int { return 4096 }); cookie != 6 || errno != 0 {
				t.Fatalf("next read: cookie %d errno %d", cookie, errno)
			}
		})
	}
}

func TestDeviceFailureIsEIOWithMessage(t *testing.T) {
	dev := newMemDevice(testSize)
	dev.fail = errors.New("lost the quorum")
	_, addr := startServer(t, dev, nil)
	rc := open(t, addr, true)
	rc.send(request{cmd: cmdRead, cookie: 3, length: 4096}, nil)
	c := rc.chunk()
	if c.typ != replyError || c.flags != replyFlagDone || c.cookie != 3 || Errno(binary.BigEndian.Uint32(c.payload)) != EIO {
		t.Fatalf("chunk %+v, want an EIO error chunk", c)
	}
	if msg := string(c.payload[6:]); !bytes.Contains([]byte(msg), []byte("lost the quorum")) {
		t.Errorf("message %q does not say why", msg)
	}
}

// TestGarbageDisconnectsOnlyThatClient sends bytes that are not a request,
// and an oversized write, each on its own connection, while another
// connection goes on working.
func TestGarbageDisconnectsOnlyThatClient(t *testing.T) {
	s, addr := startServer(t, newMemDevice(testSize), nil)
	bystander := open(t, addr, false)
	garbage := open(t, addr, false)
	garbage.write(bytes.Repeat([]byte{0xde, 0xad}, 40))
	garbage.expectClosed()
	oversized := open(t, addr, false)
	oversized.send(request{cmd: cmdWrite, cookie: 1, length: MaxRequestBytes + 4096}, nil)
	oversized.expectClosed()
	midRequest := open(t, addr, false)
	midRequest.send(request{cmd: cmdWrite, cookie: 1, length: 8192}, make([]byte, 100))
	midRequest.c.Close()
	bystander.send(request{cmd: cmdWrite, cookie: 1, length: 4096}, make([]byte, 4096))
	if _, errno, _ := bystander.simpleReply(nil); errno != 0 {
		t.Fatalf("bystander's write: errno %d", errno)
	}
	if d := s.Stats().Disconnected; d != 2 {
		t.Errorf("%d clients disconnected for violations, want 2", d)
	}
}

func TestHandshakeRefusals(t *testing.T) {
	_, addr := startServer(t, newMemDevice(testSize), nil)
	oldstyle := dial(t, addr)
	oldstyle.option(optExportName, []byte("nope"))
	oldstyle.expectClosed()
	huge := dial(t, addr)
	huge.option(optGo, make([]byte, maxOptionBytes+1))
	huge.expectClosed()
	name := dial(t, addr)
	name.option(optExportName, []byte("vol"))
	var h [10]byte // size and flags, no zeroes (NO_ZEROES was agreed)
	name.readFull(h[:])
	if size := binary.BigEndian.Uint64(h[:]); size != testSize {
		t.Fatalf("NBD_OPT_EXPORT_NAME: size %d", size)
	}
	name.send(request{cmd: cmdFlush, cookie: 4}, nil)
	if cookie, errno, _ := name.simpleReply(nil); cookie != 4 || errno != 0 {
		t.Fatalf("flush after EXPORT_NAME: cookie %d errno %d", cookie, errno)
	}
}

func TestTLSIsRequiredAndMutual(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	if err := tlsconf.Generate(dir, nil, false); err != nil {
		t.Fatal(err)
	}
	b, err := tlsconf.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	_, addr := startServer(t, newMemDevice(testSize), func(c *Config) { c.TLS = b.ServerConfig() })

	clear := dial(t, addr)
	if typ := clear.goOrInfo(optGo, ""); typ != repErrTLSReqd {
		t.Fatalf("NBD_OPT_GO before STARTTLS: %#x, want ERR_TLS_REQD", typ)
	}

	good := dial(t, addr)
	if err := good.startTLS(b.ClientConfig("127.0.0.1")); err != nil {
		t.Fatal(err)
	}
	good.ack(optStructuredReply)
	if typ := good.goOrInfo(optGo, ""); typ != repAck {
		t.Fatalf("NBD_OPT_GO over TLS: %#x", typ)
	}
	good.send(request{cmd: cmdFlush, cookie: 1}, nil)
	if c := good.chunk(); c.typ != replyNone || c.cookie != 1 {
		t.Fatalf("flush over TLS: %+v", c)
	}

	anon := dial(t, addr)
	anon.ack(optStartTLS)
	conf := &tls.Config{RootCAs: b.Roots, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS13}
	tc := tls.Client(anon.c, conf)
	// TLS 1.3 reports a refused client certificate on the first read.
	err = tc.Handshake()
	if err == nil {
		_, err = tc.Read(make([]byte, 1))
	}
	if err == nil {
		t.Fatal("a client without a certificate got through")
	}
}

// TestShutdownFinishesRequestsInFlight starts a shutdown while a write is
// held in the device: the write completes and is answered before the
// connection closes.
func TestShutdownFinishesRequestsInFlight(t *testing.T) {
	dev := newMemDevice(testSize)
	dev.gateOff, dev.gate, dev.entered = 8192, make(chan struct{}), make(chan int64, 16)
	s, addr := startServer(t, dev, nil)
	rc := open(t, addr, false)
	rc.send(request{cmd: cmdWrite, cookie: 9, offset: 8192, length: 4096}, bytes.Repeat([]byte{7}, 4096))
	<-dev.entered
	done := make(chan error, 1)
	go func() { done <- s.Shutdown(context.Background()) }()
	close(dev.gate)
	if cookie, errno, _ := rc.simpleReply(nil); cookie != 9 || errno != 0 {
		t.Fatalf("held write: cookie %d errno %d", cookie, errno)
	}
	rc.expectClosed()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := dev.bytes(8192, 1); got[0] != 7 {
		t.Fatal("the write was not applied")
	}
}

// TestShutdownPastItsDeadlineCancelsDeviceCalls holds a read forever: the
// shutdown's context ends, the call is cancelled and the server is gone.
func TestShutdownPastItsDeadlineCancelsDeviceCalls(t *testing.T) {
	dev := newMemDevice(testSize)
	dev.gateOff, dev.gate, dev.entered = 0, make(chan struct{}), make(chan int64, 16)
	s, addr := startServer(t, dev, nil)
	rc := open(t, addr, false)
	rc.send(request{cmd: cmdRead, cookie: 1, length: 4096}, nil)
	<-dev.entered
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Shutdown(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Shutdown: %v, want context.Canceled", err)
	}
	if n := s.Stats().Connections; n != 0 {
		t.Fatalf("%d connections after Shutdown", n)
	}
}
