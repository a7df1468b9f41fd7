package nbd

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"
)

func FuzzOptionHeader(f *testing.F) {
	f.Add(binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint64(nil, magicOption), optGo), 10))
	f.Add(make([]byte, optionHeaderBytes))
	f.Fuzz(func(t *testing.T, b []byte) {
		var hdr [optionHeaderBytes]byte
		copy(hdr[:], b)
		h, err := parseOptionHeader(&hdr)
		if err == nil && h.length > maxOptionBytes {
			t.Fatalf("accepted an option of %d bytes", h.length)
		}
	})
}

func FuzzExportRequest(f *testing.F) {
	f.Add(exportRequestData("", infoBlockSize))
	f.Add(exportRequestData("vol", infoName, infoDescription, infoBlockSize))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := parseExportRequest(data)
		if err != nil {
			return
		}
		if !bytes.Equal(exportRequestData(r.name, r.infos...), data) {
			t.Fatalf("%q parsed as %+v, which encodes differently", data, r)
		}
	})
}

func FuzzRequest(f *testing.F) {
	seed := func(r request) []byte {
		b := binary.BigEndian.AppendUint32(nil, magicRequest)
		b = binary.BigEndian.AppendUint16(b, r.flags)
		b = binary.BigEndian.AppendUint16(b, r.cmd)
		b = binary.BigEndian.AppendUint64(b, r.cookie)
		b = binary.BigEndian.AppendUint64(b, r.offset)
		return binary.BigEndian.AppendUint32(b, r.length)
	}
	f.Add(seed(request{cmd: cmdRead, length: 4096}), false)
	f.Add(seed(request{cmd: cmdWrite, flags: cmdFlagFUA, offset: 1 << 20, length: 8192}), true)
	f.Add(seed(request{cmd: cmdWriteZeroes, flags: cmdFlagNoHole, offset: 1<<64 - 4096, length: 8192}), false)
	f.Fuzz(func(t *testing.T, b []byte, readOnly bool) {
		var hdr [requestHeaderBytes]byte
		copy(hdr[:], b)
		r, err := parseRequest(&hdr)
		if err != nil {
			return
		}
		g := geometry{size: testSize, blockSize: testBlockSize, readOnly: readOnly}
		v := checkRequest(r, g)
		if v.disconnect != "" {
			return
		}
		if v.payload > MaxRequestBytes {
			t.Fatalf("would read a payload of %d bytes", v.payload)
		}
		if v.errno == 0 && r.cmd != cmdFlush && r.cmd != cmdDisc {
			end := r.offset + uint64(r.length)
			if end < r.offset || end > g.size || r.offset%testBlockSize != 0 || r.length%testBlockSize != 0 {
				t.Fatalf("served %+v outside the export", r)
			}
			if readOnly && r.cmd != cmdRead {
				t.Fatalf("served %+v on a read-only export", r)
			}
		}
	})
}

// fuzzConn is a connection whose client sends in and whose replies are
// thrown away.
type fuzzConn struct {
	in io.Reader
}

func (c *fuzzConn) Read(p []byte) (int, error)       { return c.in.Read(p) }
func (c *fuzzConn) Write(p []byte) (int, error)      { return len(p), nil }
func (c *fuzzConn) Close() error                     { return nil }
func (c *fuzzConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c *fuzzConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (c *fuzzConn) SetDeadline(time.Time) error      { return nil }
func (c *fuzzConn) SetReadDeadline(time.Time) error  { return nil }
func (c *fuzzConn) SetWriteDeadline(time.Time) error { return nil }

// FuzzConnection runs a whole connection, handshake and transmission,
// on what a client sends: it must end (at the end of the input) without
// a panic or a leak.
func FuzzConnection(f *testing.F) {
	hello := binary.BigEndian.AppendUint32(nil, clientFixedNewstyle|clientNoZeroes)
	option := func(b []byte, opt uint32, data []byte) []byte {
		b = binary.BigEndian.AppendUint64(b, magicOption)
		b = binary.BigEndian.AppendUint32(b, opt)
		b = binary.BigEndian.AppendUint32(b, uint32(len(data)))
		return append(b, data...)
	}
	goStructured := option(option(append([]byte(nil), hello...), optStructuredReply, nil), optGo, exportRequestData("", infoBlockSize))
	req := func(b []byte, cmd, flags uint16, off uint64, length uint32, payload int) []byte {
		b = binary.BigEndian.AppendUint32(b, magicRequest)
		b = binary.BigEndian.AppendUint16(b, flags)
		b = binary.BigEndian.AppendUint16(b, cmd)
		b = binary.BigEndian.AppendUint64(b, 1)
		b = binary.BigEndian.AppendUint64(b, off)
		b = binary.BigEndian.AppendUint32(b, length)
		return append(b, make([]byte, payload)...)
	}
	f.Add(hello)
	f.Add(option(append([]byte(nil), hello...), optList, nil))
	f.Add(option(option(append([]byte(nil), hello...), optInfo, exportRequestData("vol")), optAbort, nil))
	f.Add(req(append([]byte(nil), goStructured...), cmdWrite, cmdFlagFUA, 4096, 4096, 4096))
	f.Add(req(req(append([]byte(nil), goStructured...), cmdRead, 0, 0, 8192, 0), cmdDisc, 0, 0, 0, 0))
	f.Add(req(option(append([]byte(nil), hello...), optExportName, []byte("vol")), cmdWriteZeroes, cmdFlagNoHole, 0, 1<<20, 0))
	f.Fuzz(func(t *testing.T, in []byte) {
		s, err := NewServer(Config{Export: Export{Name: "vol", Device: newMemDevice(testSize), Size: testSize, BlockSize: testBlockSize}})
		if err != nil {
			t.Fatal(err)
		}
		c := s.track(&fuzzConn{in: bytes.NewReader(in)})
		c.run()
		if n := s.Stats().Connections; n != 0 {
			t.Fatalf("%d connections open after the client's input ended", n)
		}
	})
}
