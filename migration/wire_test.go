package migration

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"reflect"
	"testing"
	"time"

	"tern/instance/apiv1"
	"tern/vmm"
	"tern/vmm/memory"
)

// sampleMessages has one of every message type.
var sampleMessages = []any{
	hello{Versions: []apiv1.MigrationVersion{1, 2, 7}},
	hello{Versions: []apiv1.MigrationVersion{1}, Offer: Offer{MigrationID: "m-1", DowntimeTarget: 30 * time.Millisecond, SameHost: true, APIURL: "http://127.0.0.1:8080"}},
	welcome{Version: 1},
	errorMsg{Code: codeNoCommonVersion, Message: "no common version"},
	preamble{Spec: []byte(`{"guest":"dirty"}`), VCPUs: 2, Method: MethodMemfd, Nonce: [16]byte{1, 2, 3}, Socket: "/run/tern/m.sock",
		Regions: []memory.RegionSpec{{Name: "ram", Base: 0, Size: 64 << 20}, {Name: "high", Base: 1 << 32, Size: 2 << 20, HugeTLB: true}}},
	phaseMsg{Phase: apiv1.PhaseRAMPushDirty},
	pagesHeader{Region: 1, First: 17, Count: 3},
	roundEnd{Round: 4, Pages: 999},
	roundAck{Round: 4},
	devicesMsg{Devices: []vmm.DeviceState{{Kind: "uart", Version: 1, Payload: []byte{1, 2}}, {Kind: "clock", Version: 1, Payload: []byte{}}}},
	empty{msgReady}, empty{msgDevicesOK}, empty{msgFinishReady}, empty{msgCommit}, empty{msgResumed},
	resumedMsg{targetTimes{Restore: 1234567 * time.Nanosecond, Resume: 89 * time.Microsecond}},
}

func TestEveryMessageRoundTrips(t *testing.T) {
	for _, m := range sampleMessages {
		b, err := frame(m)
		if err != nil {
			t.Fatalf("frame(%#v): %v", m, err)
		}
		typ, p, err := readFrame(bytes.NewReader(b))
		if err != nil {
			t.Fatalf("readFrame(%#v): %v", m, err)
		}
		got, err := decodeMessage(typ, p)
		if err != nil {
			t.Fatalf("decode(%#v): %v", m, err)
		}
		if dm, ok := got.(devicesMsg); ok { // an empty payload decodes as nil
			for i := range dm.Devices {
				if len(dm.Devices[i].Payload) == 0 {
					dm.Devices[i].Payload = []byte{}
				}
			}
		}
		if !reflect.DeepEqual(got, m) {
			t.Fatalf("round trip of %#v gave %#v", m, got)
		}
	}
}

func TestMalformedFramesAreErrors(t *testing.T) {
	cases := map[string][]byte{
		"zero length":   {0, 0, 0, 0, 1},
		"huge length":   {0xff, 0xff, 0xff, 0xff, 1},
		"unknown type":  {1, 0, 0, 0, 0xee},
		"truncated":     {9, 0, 0, 0, byte(msgHello), 1, 0},
		"trailing":      {4, 0, 0, 0, byte(msgWelcome), 1, 0, 9},
		"bad phase":     {2, 0, 0, 0, byte(msgPhase), 99},
		"zero pages":    {15, 0, 0, 0, byte(msgPages), 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
		"too many vers": {3, 0, 0, 0, byte(msgHello), 0xff, 0xff},
	}
	for name, b := range cases {
		typ, p, err := readFrame(bytes.NewReader(b))
		if err == nil {
			_, err = decodeMessage(typ, p)
		}
		if err == nil {
			t.Errorf("%s: no error", name)
		} else if !errors.Is(err, ErrMalformed) && !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("%s: %v does not wrap ErrMalformed", name, err)
		}
	}
}

func TestCheckPagesBounds(t *testing.T) {
	regions := []memory.RegionSpec{{Name: "ram", Size: 16 * memory.PageSize}}
	for _, c := range []struct {
		h  pagesHeader
		ok bool
	}{
		{pagesHeader{0, 0, 16}, true},
		{pagesHeader{0, 15, 1}, true},
		{pagesHeader{0, 15, 2}, false},
		{pagesHeader{0, 16, 1}, false},
		{pagesHeader{1, 0, 1}, false},
		{pagesHeader{0, ^uint64(0), 2}, false},
	} {
		if err := checkPages(c.h, regions); (err == nil) != c.ok {
			t.Errorf("checkPages(%+v) = %v", c.h, err)
		}
	}
}

// TestHelloOfferIsVersionedOnItsOwn: a hello of the first form (no offer
// block) reads as the zero Offer, and a later block version's extra
// fields are skipped while version 1's are read; a version 1 block with
// trailing bytes or a block version 0 is malformed.
func TestHelloOfferIsVersionedOnItsOwn(t *testing.T) {
	old := []byte{1, 0, 1, 0} // one version: 1
	m, err := decodeMessage(msgHello, old)
	if h, ok := m.(hello); err != nil || !ok || !reflect.DeepEqual(h, hello{Versions: []apiv1.MigrationVersion{1}}) {
		t.Fatalf("first-form hello: %#v, %v", m, err)
	}
	want := Offer{MigrationID: "m", DowntimeTarget: 7 * time.Millisecond, SameHost: true, APIURL: "u"}
	b, err := frame(hello{Versions: []apiv1.MigrationVersion{1}, Offer: want})
	if err != nil {
		t.Fatal(err)
	}
	payload := b[5:]
	blk := payload[4:]
	next := append([]byte{}, payload[:4]...)
	next = binary.LittleEndian.AppendUint16(next, uint16(len(blk)-2+3))
	next = append(next, 2)                // block version 2
	next = append(next, blk[3:]...)       // version 1's fields
	next = append(next, 0xaa, 0xbb, 0xcc) // and ones this tern does not know
	m, err = decodeMessage(msgHello, next)
	if h, ok := m.(hello); err != nil || !ok || h.Offer != want {
		t.Fatalf("block version 2: %#v, %v; want offer %+v", m, err, want)
	}
	bad := append([]byte{}, payload[:4]...)
	bad = binary.LittleEndian.AppendUint16(bad, uint16(len(blk)-2+1))
	bad = append(bad, blk[2:]...)
	bad = append(bad, 0)
	if _, err := decodeMessage(msgHello, bad); err == nil {
		t.Error("a version 1 block with a trailing byte decoded")
	}
	zero := append(append([]byte{}, payload[:4]...), 1, 0, 0)
	if _, err := decodeMessage(msgHello, zero); err == nil {
		t.Error("block version 0 decoded")
	}
}

// TestResumedTimesAreVersionedOnTheirOwn: version 1's empty resumed reads
// as empty{msgResumed}; a later block version's extra fields are skipped
// while version 1's are read; a version 1 block with trailing bytes, a
// block version 0, a short block and a time past int64 are malformed.
func TestResumedTimesAreVersionedOnTheirOwn(t *testing.T) {
	if m, err := decodeMessage(msgResumed, nil); err != nil || m != (empty{msgResumed}) {
		t.Fatalf("empty resumed: %#v, %v", m, err)
	}
	want := targetTimes{Restore: 3 * time.Millisecond, Resume: 40 * time.Microsecond}
	b, err := frame(resumedMsg{want})
	if err != nil {
		t.Fatal(err)
	}
	payload := b[5:]
	next := append([]byte{2}, payload[1:]...)
	next = append(next, 0xaa, 0xbb)
	if m, err := decodeMessage(msgResumed, next); err != nil || m != (resumedMsg{want}) {
		t.Fatalf("block version 2: %#v, %v; want %+v", m, err, want)
	}
	bad := map[string][]byte{
		"trailing":  append(append([]byte{}, payload...), 0),
		"version 0": append([]byte{0}, payload[1:]...),
		"short":     payload[:len(payload)-1],
		"too long":  append([]byte{1}, binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64(nil, 1<<63), 0)...),
	}
	for name, p := range bad {
		if _, err := decodeMessage(msgResumed, p); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v, want ErrMalformed", name, err)
		}
	}
	if _, err := frame(resumedMsg{targetTimes{Restore: -1}}); err == nil {
		t.Error("a negative time encoded")
	}
}

func FuzzDecodeMessage(f *testing.F) {
	for _, m := range sampleMessages {
		b, err := frame(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	// A resumed of a later block version, whose extra field is skipped.
	f.Add([]byte{19, 0, 0, 0, byte(msgResumed), 2, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 9})
	f.Fuzz(func(t *testing.T, b []byte) {
		r := bytes.NewReader(b)
		for {
			typ, p, err := readFrame(r)
			if err != nil {
				return
			}
			m, err := decodeMessage(typ, p)
			if err != nil {
				continue
			}
			// What decodes re-encodes to a frame that decodes the same.
			again, err := frame(m)
			if err != nil {
				t.Fatalf("re-encoding %#v: %v", m, err)
			}
			typ2, p2, err := readFrame(bytes.NewReader(again))
			if err != nil || typ2 != typ {
				t.Fatalf("re-read %v: %v", typ2, err)
			}
			m2, err := decodeMessage(typ2, p2)
			if err != nil {
				t.Fatalf("re-decoding %#v: %v", m, err)
			}
			if r, ok := m.(resumedMsg); ok && m2 != any(r) {
				t.Fatalf("resumed %#v re-decoded as %#v", r, m2)
			}
			if h, ok := m.(pagesHeader); ok {
				_ = checkPages(h, []memory.RegionSpec{{Name: "ram", Size: 1 << 20}})
			}
		}
	})
}
