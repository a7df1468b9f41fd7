package nbd

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"tern/internal/testwait"
	"tern/volume"
)

// testTimeout bounds every wait of these tests: generous, for a busy
// machine under -race.
const testTimeout = 30 * time.Second

// memDevice is an in-memory volume with the methods an export calls (the
// embedded nil Volume stands for the rest). gate, when set, holds every
// call at offset gateOff until it is closed.
type memDevice struct {
	volume.Volume

	mu      sync.Mutex
	data    []byte
	flushes int
	fail    error // every call fails with it when set

	gateOff int64
	gate    chan struct{}
	// entered receives the offset of each call as it starts.
	entered chan int64
}

func newMemDevice(size int) *memDevice { return &memDevice{data: make([]byte, size), gateOff: -1} }

func (d *memDevice) wait(ctx context.Context, off int64) error {
	d.mu.Lock()
	gate, fail, entered := d.gate, d.fail, d.entered
	d.mu.Unlock()
	if entered != nil {
		entered <- off
	}
	if gate != nil && off == d.gateOff {
		select {
		case <-gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return fail
}

func (d *memDevice) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	if err := d.wait(ctx, off); err != nil {
		return 0, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return copy(p, d.data[off:]), nil
}

func (d *memDevice) WriteAt(ctx context.Context, p []byte, off int64) (int, error) {
	if err := d.wait(ctx, off); err != nil {
		return 0, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return copy(d.data[off:], p), nil
}

func (d *memDevice) Flush(ctx context.Context) error {
	if err := d.wait(ctx, -2); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.flushes++
	return nil
}

func (d *memDevice) WriteZeroes(ctx context.Context, off, length int64) error {
	return volume.WriteZeroesAsWrites(ctx, d.WriteAt, testBlockSize, uint64(len(d.data)), off, length)
}

func (d *memDevice) bytes(off, n int) []byte {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]byte(nil), d.data[off:off+n]...)
}

const (
	testSize      = 1 << 20
	testBlockSize = 4096
)

// startServer serves dev on a loopback port and shuts the server down
// at the end of the test, checking that no goroutine outlives it.
func startServer(t *testing.T, dev volume.Volume, tune func(*Config)) (*Server, string) {
	t.Helper()
	before := testwait.Running()
	cfg := Config{Export: Export{Name: "vol", Device: dev, Size: testSize, BlockSize: testBlockSize}}
	if tune != nil {
		tune(&cfg)
	}
	s, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		if err := <-served; !errors.Is(err, ErrServerClosed) {
			t.Errorf("Serve returned %v, want ErrServerClosed", err)
		}
		before.Returned(t, testTimeout)
	})
	return s, ln.Addr().String()
}

// rawClient speaks the protocol byte by byte, so tests can send what no
// well-behaved client would.
type rawClient struct {
	t    *testing.T
	c    net.Conn
	rw   io.ReadWriter // c, or the TLS connection over it
	mu   sync.Mutex    // serializes request writes
	info exportInfo
}

type exportInfo struct {
	size                 uint64
	flags                uint16
	minBS, prefBS, maxBS uint32
}

func dial(t *testing.T, addr string) *rawClient {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(testTimeout))
	t.Cleanup(func() { c.Close() })
	rc := &rawClient{t: t, c: c, rw: c}
	var greet [18]byte
	rc.readFull(greet[:])
	if binary.BigEndian.Uint64(greet[:]) != magicInit || binary.BigEndian.Uint64(greet[8:]) != magicOption {
		t.Fatalf("greeting %x", greet)
	}
	if f := binary.BigEndian.Uint16(greet[16:]); f != flagFixedNewstyle|flagNoZeroes {
		t.Fatalf("handshake flags %#x", f)
	}
	rc.write(binary.BigEndian.AppendUint32(nil, clientFixedNewstyle|clientNoZeroes))
	return rc
}

func (rc *rawClient) readFull(p []byte) {
	rc.t.Helper()
	if _, err := io.ReadFull(rc.rw, p); err != nil {
		rc.t.Fatalf("reading from server: %v", err)
	}
}

func (rc *rawClient) write(p []byte) {
	rc.t.Helper()
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if _, err := rc.rw.Write(p); err != nil {
		rc.t.Fatalf("writing to server: %v", err)
	}
}

// option sends one option.
func (rc *rawClient) option(opt uint32, data []byte) {
	rc.t.Helper()
	b := binary.BigEndian.AppendUint64(nil, magicOption)
	b = binary.BigEndian.AppendUint32(b, opt)
	b = binary.BigEndian.AppendUint32(b, uint32(len(data)))
	rc.write(append(b, data...))
}

// optReply reads one option reply.
func (rc *rawClient) optReply(wantOpt uint32) (uint32, []byte) {
	rc.t.Helper()
	var h [20]byte
	rc.readFull(h[:])
	if m := binary.BigEndian.Uint64(h[:]); m != magicOptionReply {
		rc.t.Fatalf("option reply magic %#x", m)
	}
	if o := binary.BigEndian.Uint32(h[8:]); o != wantOpt {
		rc.t.Fatalf("reply to option %d, want %d", o, wantOpt)
	}
	data := make([]byte, binary.BigEndian.Uint32(h[16:]))
	rc.readFull(data)
	return binary.BigEndian.Uint32(h[12:]), data
}

func exportRequestData(name string, infos ...uint16) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(len(name)))
	b = append(b, name...)
	b = binary.BigEndian.AppendUint16(b, uint16(len(infos)))
	for _, i := range infos {
		b = binary.BigEndian.AppendUint16(b, i)
	}
	return b
}

// goOrInfo sends NBD_OPT_GO or NBD_OPT_INFO and reads the replies up to
// the ACK, or returns the first error reply's type.
func (rc *rawClient) goOrInfo(opt uint32, name string) uint32 {
	rc.t.Helper()
	rc.option(opt, exportRequestData(name, infoBlockSize, infoName))
	for {
		typ, data := rc.optReply(opt)
		switch typ {
		case repAck:
			return repAck
		case repInfo:
			switch binary.BigEndian.Uint16(data) {
			case infoExport:
				rc.info.size = binary.BigEndian.Uint64(data[2:])
				rc.info.flags = binary.BigEndian.Uint16(data[10:])
			case infoBlockSize:
				rc.info.minBS = binary.BigEndian.Uint32(data[2:])
				rc.info.prefBS = binary.BigEndian.Uint32(data[6:])
				rc.info.maxBS = binary.BigEndian.Uint32(data[10:])
			}
		default:
			return typ
		}
	}
}

// ack sends an option that must be acknowledged.
func (rc *rawClient) ack(opt uint32) {
	rc.t.Helper()
	rc.option(opt, nil)
	if typ, data := rc.optReply(opt); typ != repAck {
		rc.t.Fatalf("option %d: reply %#x %q, want ACK", opt, typ, data)
	}
}

// open dials and enters transmission on the default export.
func open(t *testing.T, addr string, structured bool) *rawClient {
	t.Helper()
	rc := dial(t, addr)
	if structured {
		rc.ack(optStructuredReply)
	}
	if typ := rc.goOrInfo(optGo, ""); typ != repAck {
		t.Fatalf("NBD_OPT_GO: reply %#x", typ)
	}
	return rc
}

func (rc *rawClient) send(r request, payload []byte) {
	rc.t.Helper()
	b := binary.BigEndian.AppendUint32(nil, magicRequest)
	b = binary.BigEndian.AppendUint16(b, r.flags)
	b = binary.BigEndian.AppendUint16(b, r.cmd)
	b = binary.BigEndian.AppendUint64(b, r.cookie)
	b = binary.BigEndian.AppendUint64(b, r.offset)
	b = binary.BigEndian.AppendUint32(b, r.length)
	rc.write(append(b, payload...))
}

// simpleReply reads a simple reply; readLen is the data that follows
// when it is a successful READ.
func (rc *rawClient) simpleReply(readLen func(cookie uint64) int) (uint64, Errno, []byte) {
	rc.t.Helper()
	var h [16]byte
	rc.readFull(h[:])
	if m := binary.BigEndian.Uint32(h[:]); m != magicSimple {
		rc.t.Fatalf("simple reply magic %#x", m)
	}
	errno := Errno(binary.BigEndian.Uint32(h[4:]))
	cookie := binary.BigEndian.Uint64(h[8:])
	var data []byte
	if errno == 0 && readLen != nil {
		data = make([]byte, readLen(cookie))
		rc.readFull(data)
	}
	return cookie, errno, data
}

// chunk is one structured reply chunk.
type chunk struct {
	flags, typ uint16
	cookie     uint64
	payload    []byte
}

func (rc *rawClient) chunk() chunk {
	rc.t.Helper()
	var h [20]byte
	rc.readFull(h[:])
	if m := binary.BigEndian.Uint32(h[:]); m != magicStructured {
		rc.t.Fatalf("structured reply magic %#x", m)
	}
	c := chunk{flags: binary.BigEndian.Uint16(h[4:]), typ: binary.BigEndian.Uint16(h[6:]), cookie: binary.BigEndian.Uint64(h[8:])}
	c.payload = make([]byte, binary.BigEndian.Uint32(h[16:]))
	rc.readFull(c.payload)
	return c
}

// expectClosed waits for the server to close the connection.
func (rc *rawClient) expectClosed() {
	rc.t.Helper()
	var b [1]byte
	if n, err := rc.rw.Read(b[:]); err == nil {
		rc.t.Fatalf("read %d bytes, want the connection closed", n)
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		rc.t.Fatalf("connection still open after %v", testTimeout)
	}
}

// startTLS upgrades the connection with conf.
func (rc *rawClient) startTLS(conf *tls.Config) error {
	rc.t.Helper()
	rc.ack(optStartTLS)
	tc := tls.Client(rc.c, conf)
	if err := tc.Handshake(); err != nil {
		return fmt.Errorf("TLS handshake: %w", err)
	}
	rc.rw = tc
	return nil
}
