package migration

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"time"

	"tern/instance/apiv1"
	"tern/vmm"
	"tern/vmm/memory"
)

// SupportedVersions are the protocol versions this build of the engines
// speaks, lowest first. Version 2 differs from 1 in one message only: the
// target's resumed carries its parts of the pause (resumedMsg).
var SupportedVersions = []apiv1.MigrationVersion{1, versionTargetTimes}

// versionTargetTimes is the first protocol version whose resumed message
// carries the target's times.
const versionTargetTimes apiv1.MigrationVersion = 2

// ErrMalformed is wrapped by every error decoding a frame.
var ErrMalformed = errors.New("malformed migration message")

// msgType is a frame's type byte.
type msgType uint8

const (
	msgHello msgType = 1 + iota
	msgWelcome
	msgError
	msgPreamble
	msgReady
	msgPhase
	msgPages
	msgRoundEnd
	msgRoundAck
	msgDevices
	msgDevicesOK
	msgFinishReady
	msgCommit
	msgResumed
	msgEnd // one past the last
)

func (t msgType) String() string {
	names := [...]string{"", "hello", "welcome", "error", "preamble", "ready", "phase", "pages",
		"round-end", "round-ack", "devices", "devices-ok", "finish-ready", "commit", "resumed"}
	if t > 0 && t < msgEnd {
		return names[t]
	}
	return fmt.Sprintf("message(%d)", uint8(t))
}

// Limits of the wire format, well above real use.
const (
	maxFrame      = 64 << 20 // device state with a full serial history fits
	maxVersions   = 64
	maxErrorText  = 4096
	maxSpec       = 4 << 20
	maxRegions    = 64
	maxDevices    = 4096
	maxPagesBatch = 1 << 16 // pages of one pages frame (256 MiB)
	nonceSize     = 16
)

// Memory methods of a Preamble.
const (
	// MethodPages streams pages over the connection.
	MethodPages uint8 = 1
	// MethodMemfd hands the memfds over a unix socket (same host).
	MethodMemfd uint8 = 2
)

// Error codes carried by an error message (and by the QUIC application
// error that closes the connection).
const (
	codeInternal        uint16 = 1
	codeNoCommonVersion uint16 = 2
	codeUnknownDevice   uint16 = 3
	codeInjected        uint16 = 4
	codeIncompatible    uint16 = 5
)

// hello is the target's opening offer: its versions, then what it asks
// of this migration.
type hello struct {
	Versions []apiv1.MigrationVersion
	Offer    Offer
}

// Offer is what the target asks of the source in its hello, besides the
// protocol versions. On the wire it is a block of its own, length | block
// version | fields: a hello without it (the first form) reads as the zero
// Offer, and a later block version may append fields, which this tern
// skips. It is read before the version is chosen, so it cannot depend on
// it.
type Offer struct {
	// MigrationID names the migration in both sides' published status.
	MigrationID string
	// DowntimeTarget replaces the source's Policy.DowntimeTarget when set;
	// whole milliseconds on the wire.
	DowntimeTarget time.Duration
	// SameHost asks for the memfd hand-over (the source agrees when it has
	// a SourceConfig.SameHostSocketPrefix).
	SameHost bool
	// APIURL is the target's API, which the source's serial watchers are
	// sent to.
	APIURL string
}

// offerBlockVersion is the layout of the Offer block this tern writes.
const offerBlockVersion = 1

// maxOfferText bounds the Offer's strings.
const maxOfferText = 1024

// welcome is the source's choice.
type welcome struct{ Version apiv1.MigrationVersion }

// errorMsg reports a failure to the peer.
type errorMsg struct {
	Code    uint16
	Message string
}

// preamble is the sync phase's description of the source.
type preamble struct {
	Spec   []byte
	VCPUs  uint32
	Method uint8
	Nonce  [nonceSize]byte
	// Socket is the unix socket the memfds are handed over on
	// (MethodMemfd).
	Socket  string
	Regions []memory.RegionSpec
}

// phaseMsg announces the phase the source enters.
type phaseMsg struct{ Phase apiv1.Phase }

// pagesHeader precedes Count pages of raw data, pages First.. of Region.
type pagesHeader struct {
	Region uint16
	First  uint64
	Count  uint32
}

// roundEnd closes a round of Pages pages.
type roundEnd struct {
	Round uint32
	Pages uint64
}

// roundAck acknowledges a round.
type roundAck struct{ Round uint32 }

// devicesMsg carries the VM's state (vmm.VM.SaveState): per entry its
// kind, version and payload, which this package does not read.
type devicesMsg struct{ Devices []vmm.DeviceState }

// empty is a message with no payload (ready, devices-ok, finish-ready,
// commit, resumed).
type empty struct{ Type msgType }

// resumedMsg is the target's resumed from protocol version 2 on: its
// own parts of the pause. Its payload is a block versioned on its own,
// block version | fields (u64 nanoseconds each), so a later block version
// may append fields, which this tern skips. Version 1's resumed has no
// payload and reads as empty{msgResumed}.
type resumedMsg struct{ Times targetTimes }

// targetTimes are the target's parts of the pause, on its own clock.
type targetTimes struct {
	// Restore loads the device state (vmm.VM.RestoreState).
	Restore time.Duration
	// Resume runs from reading commit to every vCPU out of its pause.
	Resume time.Duration
}

// timesBlockVersion is the layout of the resumed block this tern writes.
const timesBlockVersion = 1

// encoder appends little-endian fields.
type encoder struct{ b []byte }

func (e *encoder) u8(v uint8)   { e.b = append(e.b, v) }
func (e *encoder) u16(v uint16) { e.b = binary.LittleEndian.AppendUint16(e.b, v) }
func (e *encoder) u32(v uint32) { e.b = binary.LittleEndian.AppendUint32(e.b, v) }
func (e *encoder) u64(v uint64) { e.b = binary.LittleEndian.AppendUint64(e.b, v) }
func (e *encoder) bytes32(p []byte) {
	e.u32(uint32(len(p)))
	e.b = append(e.b, p...)
}
func (e *encoder) str8(s string) {
	e.u8(uint8(len(s)))
	e.b = append(e.b, s...)
}
func (e *encoder) str16(s string) {
	e.u16(uint16(len(s)))
	e.b = append(e.b, s...)
}

// frame returns the encoded frame of m: length, type, payload.
func frame(m any) ([]byte, error) {
	e := &encoder{b: make([]byte, 5, 64)}
	var t msgType
	switch m := m.(type) {
	case hello:
		t = msgHello
		if len(m.Versions) > maxVersions {
			return nil, fmt.Errorf("encoding hello: %d versions, at most %d", len(m.Versions), maxVersions)
		}
		e.u16(uint16(len(m.Versions)))
		for _, v := range m.Versions {
			e.u16(uint16(v))
		}
		o := m.Offer
		if len(o.MigrationID) > maxOfferText || len(o.APIURL) > maxOfferText || o.DowntimeTarget < 0 || o.DowntimeTarget/time.Millisecond > 1<<32-1 {
			return nil, fmt.Errorf("encoding hello: offer %+v over the limits", o)
		}
		blk := &encoder{}
		blk.u8(offerBlockVersion)
		blk.str16(o.MigrationID)
		blk.u32(uint32(o.DowntimeTarget / time.Millisecond))
		blk.u8(boolByte(o.SameHost))
		blk.str16(o.APIURL)
		e.u16(uint16(len(blk.b)))
		e.b = append(e.b, blk.b...)
	case welcome:
		t = msgWelcome
		e.u16(uint16(m.Version))
	case errorMsg:
		t = msgError
		e.u16(m.Code)
		msg := m.Message
		if len(msg) > maxErrorText {
			msg = msg[:maxErrorText]
		}
		e.str16(msg)
	case preamble:
		t = msgPreamble
		if len(m.Spec) > maxSpec || len(m.Regions) > maxRegions {
			return nil, fmt.Errorf("encoding preamble: spec of %d bytes or %d regions over the limits", len(m.Spec), len(m.Regions))
		}
		e.bytes32(m.Spec)
		e.u32(m.VCPUs)
		e.u8(m.Method)
		e.b = append(e.b, m.Nonce[:]...)
		if len(m.Socket) > 4096 {
			return nil, fmt.Errorf("encoding preamble: socket path of %d bytes", len(m.Socket))
		}
		e.str16(m.Socket)
		e.u16(uint16(len(m.Regions)))
		for _, r := range m.Regions {
			if len(r.Name) > 255 {
				return nil, fmt.Errorf("encoding preamble: region name of %d bytes", len(r.Name))
			}
			e.str8(r.Name)
			e.u64(uint64(r.Base))
			e.u64(r.Size)
			e.u8(boolByte(r.HugeTLB))
		}
	case phaseMsg:
		t = msgPhase
		e.u8(uint8(m.Phase))
	case pagesHeader:
		t = msgPages
		e.u16(m.Region)
		e.u64(m.First)
		e.u32(m.Count)
	case roundEnd:
		t = msgRoundEnd
		e.u32(m.Round)
		e.u64(m.Pages)
	case roundAck:
		t = msgRoundAck
		e.u32(m.Round)
	case devicesMsg:
		t = msgDevices
		if len(m.Devices) > maxDevices {
			return nil, fmt.Errorf("encoding devices: %d devices, at most %d", len(m.Devices), maxDevices)
		}
		e.u32(uint32(len(m.Devices)))
		for _, d := range m.Devices {
			if len(d.Kind) == 0 || len(d.Kind) > 255 {
				return nil, fmt.Errorf("encoding devices: kind %q", d.Kind)
			}
			e.str8(d.Kind)
			e.u16(d.Version)
			e.bytes32(d.Payload)
		}
	case resumedMsg:
		t = msgResumed
		if m.Times.Restore < 0 || m.Times.Resume < 0 {
			return nil, fmt.Errorf("encoding resumed: negative times %+v", m.Times)
		}
		e.u8(timesBlockVersion)
		e.u64(uint64(m.Times.Restore))
		e.u64(uint64(m.Times.Resume))
	case empty:
		switch m.Type {
		case msgReady, msgDevicesOK, msgFinishReady, msgCommit, msgResumed:
			t = m.Type
		default:
			return nil, fmt.Errorf("encoding message: %v is not an empty message", m.Type)
		}
	default:
		return nil, fmt.Errorf("encoding message: unknown type %T", m)
	}
	if len(e.b)-4 > maxFrame {
		return nil, fmt.Errorf("encoding %v: %d bytes, at most %d", t, len(e.b)-4, maxFrame)
	}
	binary.LittleEndian.PutUint32(e.b, uint32(len(e.b)-4))
	e.b[4] = uint8(t)
	return e.b, nil
}

func boolByte(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}

// readFrame reads one frame: its type and payload. It allocates at most
// the frame's length, bounded by maxFrame.
func readFrame(r io.Reader) (msgType, []byte, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.LittleEndian.Uint32(hdr[:])
	if n == 0 || n > maxFrame {
		return 0, nil, fmt.Errorf("reading frame: %w: length %d", ErrMalformed, n)
	}
	t := msgType(hdr[4])
	if t == 0 || t >= msgEnd {
		return 0, nil, fmt.Errorf("reading frame: %w: unknown type %d", ErrMalformed, hdr[4])
	}
	p := make([]byte, n-1)
	if _, err := io.ReadFull(r, p); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, fmt.Errorf("reading %v: %w", t, err)
	}
	return t, p, nil
}

// decoder reads little-endian fields, remembering the first shortfall.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) take(n int) []byte {
	if d.err != nil {
		return nil
	}
	if n < 0 || n > len(d.b) {
		d.err = fmt.Errorf("need %d bytes, %d left", n, len(d.b))
		return nil
	}
	p := d.b[:n:n]
	d.b = d.b[n:]
	return p
}

func (d *decoder) u8() uint8 {
	if p := d.take(1); p != nil {
		return p[0]
	}
	return 0
}

func (d *decoder) u16() uint16 {
	if p := d.take(2); p != nil {
		return binary.LittleEndian.Uint16(p)
	}
	return 0
}

func (d *decoder) u32() uint32 {
	if p := d.take(4); p != nil {
		return binary.LittleEndian.Uint32(p)
	}
	return 0
}

func (d *decoder) u64() uint64 {
	if p := d.take(8); p != nil {
		return binary.LittleEndian.Uint64(p)
	}
	return 0
}

func (d *decoder) bytes32(max int) []byte {
	n := d.u32()
	if d.err == nil && uint64(n) > uint64(max) {
		d.err = fmt.Errorf("%d bytes, at most %d", n, max)
	}
	return append([]byte(nil), d.take(int(n))...)
}

func (d *decoder) str8() string  { return string(d.take(int(d.u8()))) }
func (d *decoder) str16() string { return string(d.take(int(d.u16()))) }

// finish reports the first error, or trailing bytes.
func (d *decoder) finish(t msgType) error {
	if d.err == nil && len(d.b) > 0 {
		d.err = fmt.Errorf("%d trailing bytes", len(d.b))
	}
	if d.err != nil {
		return fmt.Errorf("decoding %v: %w: %w", t, ErrMalformed, d.err)
	}
	return nil
}

// decodeMessage decodes the payload of a frame of type t into one of the
// message types of this file. Malformed input is an error, never a panic.
func decodeMessage(t msgType, p []byte) (any, error) {
	d := &decoder{b: p}
	var m any
	switch t {
	case msgHello:
		n := int(d.u16())
		if n > maxVersions {
			return nil, fmt.Errorf("decoding hello: %w: %d versions", ErrMalformed, n)
		}
		h := hello{}
		for range n {
			if d.err != nil {
				break
			}
			h.Versions = append(h.Versions, apiv1.MigrationVersion(d.u16()))
		}
		if d.err == nil && len(d.b) > 0 {
			h.Offer, d.err = decodeOffer(d.take(int(d.u16())))
		}
		m = h
	case msgWelcome:
		m = welcome{apiv1.MigrationVersion(d.u16())}
	case msgError:
		m = errorMsg{Code: d.u16(), Message: d.str16()}
	case msgPreamble:
		var pr preamble
		pr.Spec = d.bytes32(maxSpec)
		pr.VCPUs = d.u32()
		pr.Method = d.u8()
		copy(pr.Nonce[:], d.take(nonceSize))
		pr.Socket = d.str16()
		n := int(d.u16())
		if n > maxRegions {
			return nil, fmt.Errorf("decoding preamble: %w: %d regions", ErrMalformed, n)
		}
		for range n {
			if d.err != nil {
				break
			}
			r := memory.RegionSpec{Name: d.str8(), Base: memory.GPA(d.u64()), Size: d.u64()}
			r.HugeTLB = d.u8() != 0
			pr.Regions = append(pr.Regions, r)
		}
		if d.err == nil && pr.Method != MethodPages && pr.Method != MethodMemfd {
			d.err = fmt.Errorf("unknown memory method %d", pr.Method)
		}
		m = pr
	case msgPhase:
		ph := apiv1.Phase(d.u8())
		if d.err == nil {
			if !ph.Valid() {
				d.err = fmt.Errorf("unknown phase %d", uint8(ph))
			}
		}
		m = phaseMsg{ph}
	case msgPages:
		h := pagesHeader{Region: d.u16(), First: d.u64(), Count: d.u32()}
		if d.err == nil && (h.Count == 0 || h.Count > maxPagesBatch) {
			d.err = fmt.Errorf("%d pages in one frame", h.Count)
		}
		m = h
	case msgRoundEnd:
		m = roundEnd{Round: d.u32(), Pages: d.u64()}
	case msgRoundAck:
		m = roundAck{Round: d.u32()}
	case msgDevices:
		n := d.u32()
		if n > maxDevices {
			return nil, fmt.Errorf("decoding devices: %w: %d devices", ErrMalformed, n)
		}
		var dm devicesMsg
		for range n {
			if d.err != nil {
				break
			}
			ds := vmm.DeviceState{Kind: d.str8(), Version: d.u16(), Payload: d.bytes32(maxFrame)}
			if d.err == nil && ds.Kind == "" {
				d.err = errors.New("device with an empty kind")
			}
			dm.Devices = append(dm.Devices, ds)
		}
		m = dm
	case msgResumed:
		if len(d.b) == 0 {
			m = empty{t}
			break
		}
		var tt targetTimes
		tt, d.err = decodeTargetTimes(d.take(len(d.b)))
		m = resumedMsg{tt}
	case msgReady, msgDevicesOK, msgFinishReady, msgCommit:
		m = empty{t}
	default:
		return nil, fmt.Errorf("decoding message: %w: unknown type %d", ErrMalformed, uint8(t))
	}
	if err := d.finish(t); err != nil {
		return nil, err
	}
	return m, nil
}

// decodeOffer reads an Offer block: version 1's fields, and nothing of a
// later version's beyond them.
func decodeOffer(b []byte) (Offer, error) {
	d := &decoder{b: b}
	v := d.u8()
	if d.err == nil && v == 0 {
		return Offer{}, errors.New("offer block version 0")
	}
	o := Offer{MigrationID: d.str16()}
	o.DowntimeTarget = time.Duration(d.u32()) * time.Millisecond
	o.SameHost = d.u8() != 0
	o.APIURL = d.str16()
	switch {
	case d.err != nil:
		return Offer{}, fmt.Errorf("offer: %w", d.err)
	case len(o.MigrationID) > maxOfferText || len(o.APIURL) > maxOfferText:
		return Offer{}, errors.New("offer: a string over the limit")
	case v == offerBlockVersion && len(d.b) > 0:
		return Offer{}, fmt.Errorf("offer: %d trailing bytes", len(d.b))
	}
	return o, nil
}

// decodeTargetTimes reads a resumed block: version 1's fields, and
// nothing of a later version's beyond them.
func decodeTargetTimes(b []byte) (targetTimes, error) {
	d := &decoder{b: b}
	v := d.u8()
	restore, resume := d.u64(), d.u64()
	switch {
	case d.err != nil:
		return targetTimes{}, fmt.Errorf("target times: %w", d.err)
	case v == 0:
		return targetTimes{}, errors.New("target times: block version 0")
	case restore > math.MaxInt64 || resume > math.MaxInt64:
		return targetTimes{}, errors.New("target times: a time over the limit")
	case v == timesBlockVersion && len(d.b) > 0:
		return targetTimes{}, fmt.Errorf("target times: %d trailing bytes", len(d.b))
	}
	return targetTimes{Restore: time.Duration(restore), Resume: time.Duration(resume)}, nil
}

// checkPages reports whether h names pages inside the layout.
func checkPages(h pagesHeader, regions []memory.RegionSpec) error {
	if int(h.Region) >= len(regions) {
		return fmt.Errorf("checking pages: %w: region %d of %d", ErrMalformed, h.Region, len(regions))
	}
	pages := regions[h.Region].Size / memory.PageSize
	if h.First >= pages || uint64(h.Count) > pages-h.First {
		return fmt.Errorf("checking pages: %w: pages [%d, +%d) outside region %q of %d pages",
			ErrMalformed, h.First, h.Count, regions[h.Region].Name, pages)
	}
	return nil
}
