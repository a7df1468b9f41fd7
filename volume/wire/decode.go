package wire

import (
	"bufio"
	"errors"
	"fmt"
	"io"
)

// readBufferSize is the Decoder's read-ahead. Bulk data larger than this is
// read straight from the underlying reader into its destination.
const readBufferSize = 64 << 10

// DataBufferFunc chooses where the bulk data of a message goes: it returns a
// buffer of at least n bytes for the data of the message of type t with the
// given job, or nil to let the Decoder use its own reused buffer.
type DataBufferFunc func(t MsgType, job JobID, n int) []byte

// Decoder reads frames from an io.Reader. It is not safe for concurrent use.
//
// Next returns messages that live inside the Decoder: a message and its
// slices are valid until the following call to Next, except bulk data read
// into a buffer supplied by DataBuffer, which belongs to the caller.
type Decoder struct {
	// DataBuffer, if set, is asked for the destination of each message's
	// bulk data, so that a read lands directly in its final place (guest
	// memory on the upstairs, a pooled job buffer on the downstairs).
	DataBuffer DataBufferFunc

	r    *bufio.Reader
	hdr  [HeaderSize]byte
	buf  []byte // payload except bulk data
	data []byte // bulk data when DataBuffer supplies none

	// Reused backing arrays of decoded slices.
	versions []ProtocolVersion
	deps     []JobID
	hashes   []uint64
	blocks   []uint32
	extents  []ExtentVersion

	// One reused value per message type.
	hello          Hello
	helloReply     HelloReply
	errMsg         Error
	activate       Activate
	activateAck    ActivateAck
	fenced         Fenced
	regionReq      RegionInfoRequest
	regionReply    RegionInfoReply
	versionsReq    ExtentVersionsRequest
	extentVersions ExtentVersions
	write          Write
	read           Read
	readResp       ReadResponse
	flush          Flush
	ack            Ack
	hashesReq      ExtentHashesRequest
	extentHashes   ExtentHashes
	repairRead     RepairRead
	repairData     RepairData
	repairWrite    RepairWrite
}

// NewDecoder returns a Decoder reading from r.
func NewDecoder(r io.Reader) *Decoder {
	return &Decoder{r: bufio.NewReaderSize(r, readBufferSize)}
}

// Next reads and decodes one frame. At a clean end of stream between frames
// it returns io.EOF; a stream that ends inside a frame is
// io.ErrUnexpectedEOF.
func (d *Decoder) Next() (Message, error) {
	if _, err := io.ReadFull(d.r, d.hdr[:]); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, io.EOF
		}
		return nil, fmt.Errorf("reading frame header: %w", err)
	}
	t, n, err := parseHeader(d.hdr[:])
	if err != nil {
		return nil, err
	}
	if t.HasData() {
		return d.nextBulk(t, n)
	}
	p, err := d.readPayload(0, n)
	if err != nil {
		return nil, err
	}
	m, err := d.parse(t, p)
	if err != nil {
		return nil, fmt.Errorf("decoding %v: %w", t, err)
	}
	return m, nil
}

// parseHeader validates a frame header and returns its type and payload
// length, checked against the type's largest legal payload.
func parseHeader(h []byte) (MsgType, int, error) {
	if le.Uint16(h[0:]) != FrameMagic {
		return 0, 0, fmt.Errorf("reading frame header: %w", ErrBadMagic)
	}
	t := MsgType(le.Uint16(h[2:]))
	if !t.Valid() {
		return 0, 0, fmt.Errorf("reading frame header: type %d: %w", uint16(t), ErrUnknownType)
	}
	n := uint64(le.Uint32(h[4:]))
	if n > uint64(maxPayloadOf(t)) {
		return 0, 0, fmt.Errorf("reading %v frame: %d byte payload: %w", t, n, ErrFrameTooLarge)
	}
	return t, int(n), nil
}

// maxPayloadOf bounds each type's payload so a header cannot make the
// decoder reserve more than that type can legally need.
func maxPayloadOf(t MsgType) int {
	switch t {
	case TypeHello:
		return 2 + 4*MaxVersions + 3*uuidSize + 1
	case TypeHelloReply:
		return 4 + regionInfoSize
	case TypeError:
		return 8 + 2 + 2 + MaxErrorMessage
	case TypeActivate:
		return 8 + 2*uuidSize + 8
	case TypeActivateAck:
		return 16 + 1
	case TypeFenced:
		return 16 + uuidSize
	case TypeRegionInfoRequest, TypeAck:
		return 8
	case TypeRegionInfoReply:
		return 8 + regionInfoSize
	case TypeExtentVersionsRequest, TypeExtentHashesRequest:
		return 16
	case TypeExtentVersions:
		return 16 + MaxExtentVersions*extentVersionSize
	case TypeRead:
		return 24 + 8*MaxDeps
	case TypeFlush:
		return 28 + 8*MaxDeps
	case TypeExtentHashes:
		return 12 + extentVersionSize + 4 + 8*MaxExtentHashes
	case TypeRepairRead:
		return 16 + 4*MaxRepairBlocks
	}
	return MaxPayload
}

// readPayload reads n bytes into d.buf[off:off+n], growing it as needed, and
// returns d.buf[:off+n]. n is already bounded by maxPayloadOf.
func (d *Decoder) readPayload(off, n int) ([]byte, error) {
	need := off + n
	if cap(d.buf) < need {
		nb := make([]byte, need, max(need, 2*cap(d.buf)))
		copy(nb, d.buf[:off])
		d.buf = nb
	}
	d.buf = d.buf[:need]
	if _, err := io.ReadFull(d.r, d.buf[off:need]); err != nil {
		return nil, fmt.Errorf("reading payload: %w", noEOF(err))
	}
	return d.buf, nil
}

// noEOF turns a plain EOF inside a frame into ErrUnexpectedEOF.
func noEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// bulkLayout describes the non-data part of a bulk message.
type bulkLayout struct {
	prefix int // fixed fields, counts included
	// meta returns the bytes of arrays after the prefix and the data length,
	// from the counts in the prefix.
	meta func(p []byte) (metaLen, dataLen uint64, err error)
}

// bulkLayouts holds the layout of each type with data (HasData); an
// array rather than a map, so it is laid out by the linker, not built
// when the process starts.
var bulkLayouts = [typeLimit]bulkLayout{
	TypeWrite: {28, func(p []byte) (uint64, uint64, error) {
		deps, hashes, data := le.Uint32(p[16:]), le.Uint32(p[20:]), le.Uint32(p[24:])
		if deps > MaxDeps || hashes > maxBulkHashes {
			return 0, 0, fmt.Errorf("%d deps, %d hashes: %w", deps, hashes, ErrMalformed)
		}
		return 8*uint64(deps) + 8*uint64(hashes), uint64(data), nil
	}},
	TypeReadResponse: {16, func(p []byte) (uint64, uint64, error) {
		hashes := le.Uint32(p[8:])
		if hashes > maxBulkHashes {
			return 0, 0, fmt.Errorf("%d hashes: %w", hashes, ErrMalformed)
		}
		return 8 * uint64(hashes), uint64(le.Uint32(p[12:])), nil
	}},
	TypeRepairData: {20, func(p []byte) (uint64, uint64, error) {
		blocks := le.Uint32(p[12:])
		if blocks > MaxRepairBlocks {
			return 0, 0, fmt.Errorf("%d blocks: %w", blocks, ErrMalformed)
		}
		return 12 * uint64(blocks), uint64(le.Uint32(p[16:])), nil
	}},
	TypeRepairWrite: {12 + extentVersionSize + 8, func(p []byte) (uint64, uint64, error) {
		blocks := le.Uint32(p[12+extentVersionSize:])
		if blocks > MaxRepairBlocks {
			return 0, 0, fmt.Errorf("%d blocks: %w", blocks, ErrMalformed)
		}
		return 12 * uint64(blocks), uint64(le.Uint32(p[16+extentVersionSize:])), nil
	}},
}

// nextBulk decodes a message with bulk data: prefix, then arrays, then the
// data straight into its destination.
func (d *Decoder) nextBulk(t MsgType, n int) (Message, error) {
	layout := bulkLayouts[t]
	if n < layout.prefix {
		return nil, fmt.Errorf("decoding %v: %d byte payload: %w", t, n, ErrMalformed)
	}
	p, err := d.readPayload(0, layout.prefix)
	if err != nil {
		return nil, fmt.Errorf("decoding %v: %w", t, err)
	}
	metaLen, dataLen, err := layout.meta(p)
	if err != nil {
		return nil, fmt.Errorf("decoding %v: %w", t, err)
	}
	if dataLen > MaxDataSize || uint64(layout.prefix)+metaLen+dataLen != uint64(n) {
		return nil, fmt.Errorf("decoding %v: counts disagree with %d byte payload: %w", t, n, ErrMalformed)
	}
	if p, err = d.readPayload(layout.prefix, int(metaLen)); err != nil {
		return nil, fmt.Errorf("decoding %v: %w", t, err)
	}
	m, err := d.parse(t, p)
	if err != nil {
		return nil, fmt.Errorf("decoding %v: %w", t, err)
	}
	job, _ := JobOf(m)
	data, err := d.readData(t, job, int(dataLen))
	if err != nil {
		return nil, fmt.Errorf("decoding %v: %w", t, err)
	}
	switch m := m.(type) {
	case *Write:
		m.Data = data
	case *ReadResponse:
		m.Data = data
	case *RepairData:
		m.Data = data
	case *RepairWrite:
		m.Data = data
	}
	return m, nil
}

// readData reads n bytes of bulk data into the caller's buffer if
// DataBuffer offers one large enough, else into the Decoder's own.
func (d *Decoder) readData(t MsgType, job JobID, n int) ([]byte, error) {
	if n == 0 {
		return nil, nil
	}
	var dst []byte
	if d.DataBuffer != nil {
		dst = d.DataBuffer(t, job, n)
	}
	if len(dst) < n {
		if cap(d.data) < n {
			d.data = make([]byte, n)
		}
		dst = d.data
	}
	dst = dst[:n]
	if _, err := io.ReadFull(d.r, dst); err != nil {
		return nil, fmt.Errorf("reading data: %w", noEOF(err))
	}
	return dst, nil
}
