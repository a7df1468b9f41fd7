package wire

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"testing"

	"github.com/google/uuid"
)

var (
	testRegion = RegionInfo{UUID: uuid.MustParse("0f4d5a2c-95a6-4c1e-9b55-1a9b0c7e2d11"), BlockSize: 4096, ExtentBlocks: 16384, ExtentCount: 8}
	upID       = uuid.MustParse("6b2f7d3e-2a1c-4f0e-8d9b-3c4a5b6c7d8e")
	sessID     = uuid.MustParse("9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d")
)

func blockData(n int, seed byte) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = seed + byte(i*7)
	}
	return p
}

// sampleMessages returns one populated value of every message type.
func sampleMessages() []Message {
	return []Message{
		&Hello{Versions: []ProtocolVersion{1, 2}, RegionUUID: testRegion.UUID, ReadOnly: true, UpstairsID: upID, SessionID: sessID},
		&HelloReply{Version: 1, Region: testRegion},
		&Error{JobID: 1001, Code: CodeHashMismatch, Message: "block 3 hash mismatch"},
		&Activate{JobID: 1, UpstairsID: upID, SessionID: sessID, Gen: 7},
		&ActivateAck{JobID: 1, Gen: 7},
		&ActivateAck{JobID: 1, Gen: 7, LostWrites: true},
		&Fenced{JobID: 42, ByGen: 8, ByUpstairs: sessID},
		&RegionInfoRequest{JobID: 2},
		&RegionInfoReply{JobID: 2, Region: testRegion},
		&ExtentVersionsRequest{JobID: 3, First: 2, Count: 3},
		&ExtentVersions{JobID: 3, First: 2, Versions: []ExtentVersion{{1, 2, false}, {3, 4, true}, {5, 6, false}}},
		&Write{JobID: 1000, Deps: []JobID{998, 999}, Offset: 77, Hashes: []uint64{11, 22}, Data: blockData(1024, 1)},
		&Read{JobID: 1002, Deps: []JobID{1000}, Offset: 77, Count: 2},
		&ReadResponse{JobID: 1002, Hashes: []uint64{11, 22}, Data: blockData(1024, 2)},
		&Flush{JobID: 1003, Deps: []JobID{1000, 1002}, FlushNumber: 12, Gen: 7},
		&Ack{JobID: 1003},
		&ExtentHashesRequest{JobID: 4, Extent: 5},
		&ExtentHashes{JobID: 4, Extent: 5, Version: ExtentVersion{7, 12, true}, Hashes: []uint64{1, 2, 3, 0}},
		&RepairRead{JobID: 5, Extent: 5, Blocks: []uint32{0, 3}},
		&RepairData{JobID: 5, Extent: 5, Blocks: []uint32{0, 3}, Hashes: []uint64{9, 8}, Data: blockData(1024, 3)},
		&RepairWrite{JobID: 6, Extent: 5, Version: ExtentVersion{7, 12, false}, Blocks: []uint32{0, 3}, Hashes: []uint64{9, 8}, Data: blockData(1024, 4)},
	}
}

// normalize makes empty slices nil so a decoded message compares equal to
// the one encoded.
func normalize(m Message) Message {
	v := reflect.ValueOf(m).Elem()
	for i := range v.NumField() {
		f := v.Field(i)
		if f.Kind() == reflect.Slice && f.Len() == 0 {
			f.Set(reflect.Zero(f.Type()))
		}
	}
	return m
}

// clone deep-copies a decoded message out of the Decoder's storage.
func clone(m Message) Message { return normalize(Clone(m)) }

func TestEveryMessageRoundTrips(t *testing.T) {
	seen := map[MsgType]bool{}
	var stream bytes.Buffer
	enc := NewEncoder(&stream)
	msgs := sampleMessages()
	for _, m := range msgs {
		if err := enc.Encode(m); err != nil {
			t.Fatalf("Encode(%v): %v", m.Type(), err)
		}
		seen[m.Type()] = true
	}
	for typ := MsgType(0); typ < typeLimit; typ++ {
		if typ.Valid() && !seen[typ] {
			t.Errorf("no round-trip sample for %v", typ)
		}
	}
	dec := NewDecoder(&stream)
	for _, want := range msgs {
		got, err := dec.Next()
		if err != nil {
			t.Fatalf("Next for %v: %v", want.Type(), err)
		}
		if !reflect.DeepEqual(clone(got), normalize(want)) {
			t.Errorf("%v round trip:\n got %+v\nwant %+v", want.Type(), got, want)
		}
	}
	if _, err := dec.Next(); err != io.EOF {
		t.Fatalf("Next at end = %v, want io.EOF", err)
	}
}

func TestEmptyAndZeroMessagesRoundTrip(t *testing.T) {
	msgs := []Message{
		&Write{JobID: 1}, &Read{}, &ReadResponse{}, &Flush{}, &ExtentVersions{},
		&ExtentHashes{}, &RepairRead{}, &RepairData{}, &RepairWrite{}, &Error{},
		&Hello{Versions: []ProtocolVersion{1}},
	}
	for _, m := range msgs {
		frame, data, err := AppendFrame(nil, m)
		if err != nil {
			t.Fatalf("AppendFrame(%v): %v", m.Type(), err)
		}
		got, err := NewDecoder(bytes.NewReader(append(frame, data...))).Next()
		if err != nil {
			t.Fatalf("decode %v: %v", m.Type(), err)
		}
		if !reflect.DeepEqual(clone(got), normalize(m)) {
			t.Errorf("%v: got %+v want %+v", m.Type(), got, m)
		}
	}
}

func TestDataBufferReceivesBulkDataInPlace(t *testing.T) {
	want := &ReadResponse{JobID: 9, Hashes: []uint64{1, 2}, Data: blockData(8192, 5)}
	frame, data, err := AppendFrame(nil, want)
	if err != nil {
		t.Fatal(err)
	}
	guest := make([]byte, 3*4096)
	dec := NewDecoder(bytes.NewReader(append(frame, data...)))
	var askedType MsgType
	var askedJob JobID
	var askedLen int
	dec.DataBuffer = func(typ MsgType, job JobID, n int) []byte {
		askedType, askedJob, askedLen = typ, job, n
		return guest[4096:]
	}
	m, err := dec.Next()
	if err != nil {
		t.Fatal(err)
	}
	got := m.(*ReadResponse)
	if askedType != TypeReadResponse || askedJob != 9 || askedLen != 8192 {
		t.Fatalf("DataBuffer asked (%v, %d, %d)", askedType, askedJob, askedLen)
	}
	if &got.Data[0] != &guest[4096] {
		t.Fatal("data was not placed in the supplied buffer")
	}
	if !bytes.Equal(guest[4096:], want.Data) || !bytes.Equal(guest[:4096], make([]byte, 4096)) {
		t.Fatal("guest buffer holds the wrong bytes")
	}
}

func TestDataBufferTooSmallFallsBackToDecoderBuffer(t *testing.T) {
	want := &Write{JobID: 9, Hashes: []uint64{1}, Data: blockData(4096, 5)}
	frame, data, _ := AppendFrame(nil, want)
	dec := NewDecoder(bytes.NewReader(append(frame, data...)))
	small := make([]byte, 100)
	dec.DataBuffer = func(MsgType, JobID, int) []byte { return small }
	m, err := dec.Next()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(m.(*Write).Data, want.Data) || !bytes.Equal(small, make([]byte, 100)) {
		t.Fatal("fallback decode wrong or small buffer written")
	}
}

func TestEncodeWritesDataFromCallerSlice(t *testing.T) {
	data := blockData(4096, 9)
	var w recordingWriter
	if err := NewEncoder(&w).Encode(&Write{JobID: 1, Hashes: []uint64{1}, Data: data}); err != nil {
		t.Fatal(err)
	}
	if len(w.writes) != 2 || &w.writes[1][0] != &data[0] {
		t.Fatalf("want header write then the caller's data slice, got %d writes", len(w.writes))
	}
}

type recordingWriter struct{ writes [][]byte }

func (w *recordingWriter) Write(p []byte) (int, error) {
	w.writes = append(w.writes, p)
	return len(p), nil
}

func TestEncodeRejectsOversizedMessages(t *testing.T) {
	cases := []Message{
		&Write{Hashes: make([]uint64, 1), Data: make([]byte, MaxDataSize+1)},
		&Write{Deps: make([]JobID, MaxDeps+1)},
		&Read{Deps: make([]JobID, MaxDeps+1)},
		&Hello{},
		&Hello{Versions: make([]ProtocolVersion, MaxVersions+1)},
		&ExtentHashes{Hashes: make([]uint64, MaxExtentHashes+1)},
		&RepairRead{Blocks: make([]uint32, MaxRepairBlocks+1)},
		&RepairWrite{Blocks: []uint32{1}, Hashes: nil},
	}
	for _, m := range cases {
		if err := NewEncoder(io.Discard).Encode(m); err == nil {
			t.Errorf("Encode(%v) succeeded, want error", m.Type())
		}
	}
}

// ascendingBlocks returns the block list 0, 1, ..., n-1.
func ascendingBlocks(n int) []uint32 {
	b := make([]uint32, n)
	for i := range b {
		b[i] = uint32(i)
	}
	return b
}

// TestRepairBlockListsMustStrictlyIncrease: a repair block list with a
// duplicate or out of order is refused by the Encoder and, built by hand,
// by the Decoder, for every message that carries one.
func TestRepairBlockListsMustStrictlyIncrease(t *testing.T) {
	data := make([]byte, 2*512)
	messages := func(blocks []uint32) []Message {
		return []Message{
			&RepairRead{JobID: 1, Extent: 2, Blocks: blocks},
			&RepairData{JobID: 1, Extent: 2, Blocks: blocks, Hashes: []uint64{5, 6}, Data: data},
			&RepairWrite{JobID: 1, Extent: 2, Blocks: blocks, Hashes: []uint64{5, 6}, Data: data},
		}
	}
	for _, bad := range [][]uint32{{3, 3}, {4, 3}} {
		good := messages([]uint32{3, 4})
		for i, m := range messages(bad) {
			t.Run(fmt.Sprintf("%v %v", m.Type(), bad), func(t *testing.T) {
				if err := NewEncoder(io.Discard).Encode(m); !errors.Is(err, ErrMalformed) {
					t.Fatalf("Encode: %v, want ErrMalformed", err)
				}
				// Encode the sorted list, then rewrite it in place.
				frame, d, err := AppendFrame(nil, good[i])
				if err != nil {
					t.Fatal(err)
				}
				at := bytes.Index(frame, []byte{3, 0, 0, 0, 4, 0, 0, 0})
				le.PutUint32(frame[at:], bad[0])
				le.PutUint32(frame[at+4:], bad[1])
				_, err = NewDecoder(bytes.NewReader(append(frame, d...))).Next()
				if !errors.Is(err, ErrMalformed) {
					t.Fatalf("Next: %v, want ErrMalformed", err)
				}
			})
		}
	}
}

func TestLargestMessagesFitMaxPayload(t *testing.T) {
	cases := []Message{
		&Write{Deps: make([]JobID, MaxDeps), Hashes: make([]uint64, MaxDataSize/512), Data: make([]byte, MaxDataSize)},
		&ExtentHashes{Hashes: make([]uint64, MaxExtentHashes)},
		&ExtentVersions{Versions: make([]ExtentVersion, MaxExtentVersions)},
		&RepairWrite{Blocks: ascendingBlocks(MaxRepairBlocks), Hashes: make([]uint64, MaxRepairBlocks), Data: make([]byte, MaxDataSize)},
		&Error{Message: strings.Repeat("x", 2*MaxErrorMessage)},
	}
	for _, m := range cases {
		frame, data, err := AppendFrame(nil, m)
		if err != nil {
			t.Fatalf("AppendFrame(%v): %v", m.Type(), err)
		}
		if _, err := NewDecoder(bytes.NewReader(append(frame, data...))).Next(); err != nil {
			t.Fatalf("decode largest %v: %v", m.Type(), err)
		}
	}
}

func header(typ MsgType, n uint32) []byte {
	h := make([]byte, HeaderSize)
	le.PutUint16(h, FrameMagic)
	le.PutUint16(h[2:], uint16(typ))
	le.PutUint32(h[4:], n)
	return h
}

func TestDecodeRejectsMalformedFrames(t *testing.T) {
	ack, _, _ := AppendFrame(nil, &Ack{JobID: 3})
	write, wdata, _ := AppendFrame(nil, &Write{JobID: 1, Hashes: []uint64{1}, Data: make([]byte, 512)})
	fullWrite := append(append([]byte{}, write...), wdata...)
	badBool, _, _ := AppendFrame(nil, &Hello{Versions: []ProtocolVersion{1}})
	badBool[HeaderSize+2+4+16] = 2
	cases := []struct {
		name  string
		input []byte
		want  error
	}{
		{"bad magic", append([]byte{0, 0}, ack[2:]...), ErrBadMagic},
		{"unknown type", header(999, 0), ErrUnknownType},
		{"type zero", header(0, 0), ErrUnknownType},
		{"oversized payload", header(TypeWrite, MaxPayload+1), ErrFrameTooLarge},
		{"oversized ack", header(TypeAck, 9), ErrFrameTooLarge},
		{"short ack", append(header(TypeAck, 4), 1, 2, 3, 4), ErrMalformed},
		{"read with trailing bytes", append(header(TypeRead, 25), make([]byte, 25)...), ErrMalformed},
		{"read deps beyond payload", append(header(TypeRead, 24), 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 255, 255, 255, 255), ErrMalformed},
		{"truncated header", ack[:5], io.ErrUnexpectedEOF},
		{"truncated payload", ack[:HeaderSize+3], io.ErrUnexpectedEOF},
		{"truncated write data", fullWrite[:len(fullWrite)-1], io.ErrUnexpectedEOF},
		{"write shorter than prefix", append(header(TypeWrite, 4), 0, 0, 0, 0), ErrMalformed},
		{"bool not 0 or 1", badBool, ErrMalformed},
		{"hello with no versions", append(header(TypeHello, 2), 0, 0), ErrMalformed},
	}
	// A Write whose counts claim more than the payload holds.
	lying := append([]byte{}, fullWrite...)
	le.PutUint32(lying[HeaderSize+20:], 1<<30)
	cases = append(cases, struct {
		name  string
		input []byte
		want  error
	}{"write counts disagree", lying, ErrMalformed})
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewDecoder(bytes.NewReader(tc.input)).Next()
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
		})
	}
}

func TestChooseVersion(t *testing.T) {
	cases := []struct {
		offered []ProtocolVersion
		want    ProtocolVersion
		ok      bool
	}{
		{[]ProtocolVersion{1}, 1, true},
		{[]ProtocolVersion{9, 1, 3}, 1, true},
		{[]ProtocolVersion{2, 3}, 0, false},
		{nil, 0, false},
	}
	for _, tc := range cases {
		got, ok := ChooseVersion(tc.offered)
		if got != tc.want || ok != tc.ok {
			t.Errorf("ChooseVersion(%v) = %d, %v; want %d, %v", tc.offered, got, ok, tc.want, tc.ok)
		}
	}
}

func TestRemoteErrorMatchesCode(t *testing.T) {
	err := (&Error{JobID: 3, Code: CodeFenced, Message: "by gen 9"}).Err()
	if !errors.Is(err, CodeFenced) || errors.Is(err, CodeIO) {
		t.Fatalf("errors.Is mismatch for %v", err)
	}
	if !strings.Contains(err.Error(), "fenced") || !strings.Contains(err.Error(), "by gen 9") {
		t.Fatalf("error text %q", err)
	}
}
