package devices

import (
	"bytes"
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"tern/vmm/memory"
)

// Guest-physical layout used by the test driver.
const (
	tdDesc   memory.GPA = 0x10000
	tdAvail  memory.GPA = 0x11000
	tdUsed   memory.GPA = 0x12000
	tdHeader memory.GPA = 0x13000
	tdStatus memory.GPA = 0x13100
	tdData   memory.GPA = 0x20000
	tdQSize             = 16
)

type rawDesc struct {
	addr  memory.GPA
	len   uint32
	flags uint16
	next  uint16
}

// testDriver drives the device from Go exactly as a guest driver would:
// MMIO register accesses and rings in guest memory.
type testDriver struct {
	t        testing.TB
	mem      *memory.Memory
	dev      *VirtioMMIO
	irq      *countingIRQ
	disk     string
	availIdx uint16
}

func newTestDriver(t testing.TB, blockSize int, diskBytes int64) *testDriver {
	t.Helper()
	d, backend := newTestDisk(t, blockSize, diskBytes)
	d.irq = &countingIRQ{}
	d.dev = NewVirtioMMIO(context.Background(), NewVirtioBlk(backend, "tern-disk-0", d.mem), d.mem, d.irq)
	return d
}

// newTestDisk returns a driver with guest memory and a file-backed disk
// but no device yet, and the disk's backend.
func newTestDisk(t testing.TB, blockSize int, diskBytes int64) (*testDriver, *FileBackend) {
	t.Helper()
	mem, err := memory.New(memory.RegionSpec{Name: "ram", Size: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mem.Close() })
	disk := filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(disk, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(disk, diskBytes); err != nil {
		t.Fatal(err)
	}
	backend, err := OpenFileBackend(disk, blockSize)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { backend.Close() })
	return &testDriver{t: t, mem: mem, disk: disk}, backend
}

func (d *testDriver) reg(off uint64) uint32 {
	b := make([]byte, 4)
	d.dev.ReadMMIO(off, b)
	return binary.LittleEndian.Uint32(b)
}

func (d *testDriver) setReg(off uint64, v uint32) {
	d.dev.WriteMMIO(off, binary.LittleEndian.AppendUint32(nil, v))
}

// setUp runs the virtio 1.x initialization sequence, accepting features.
func (d *testDriver) setUp(features uint64) {
	d.t.Helper()
	d.setReg(mmioStatus, 0)
	d.setReg(mmioStatus, StatusAcknowledge|StatusDriver)
	d.setReg(mmioDriverFeaturesSel, 0)
	d.setReg(mmioDriverFeatures, uint32(features))
	d.setReg(mmioDriverFeaturesSel, 1)
	d.setReg(mmioDriverFeatures, uint32(features>>32))
	d.setReg(mmioStatus, StatusAcknowledge|StatusDriver|StatusFeaturesOK)
	if d.reg(mmioStatus)&StatusFeaturesOK == 0 {
		d.t.Fatal("device refused the features")
	}
	d.setReg(mmioQueueSel, 0)
	d.setReg(mmioQueueNum, tdQSize)
	d.setReg(mmioQueueDescLow, uint32(tdDesc))
	d.setReg(mmioQueueDriverLow, uint32(tdAvail))
	d.setReg(mmioQueueDeviceLow, uint32(tdUsed))
	d.setReg(mmioQueueReady, 1)
	d.setReg(mmioStatus, StatusAcknowledge|StatusDriver|StatusFeaturesOK|StatusDriverOK)
	if d.reg(mmioQueueReady) != 1 || d.reg(mmioStatus)&StatusNeedsReset != 0 {
		d.t.Fatal("queue not ready")
	}
}

// submit writes descs at table indexes 0.. (linked in order unless a
// desc sets its own next), publishes head 0 and notifies; it returns the
// used length, or ok=false when the device used nothing.
func (d *testDriver) submit(descs []rawDesc, link bool) (uint32, bool) {
	d.t.Helper()
	usedBefore := d.publish(descs, link)
	d.setReg(mmioQueueNotify, 0)
	return d.usedSince(usedBefore)
}

// publish writes descs as submit does and makes head 0 available without
// notifying; it returns the used index before.
func (d *testDriver) publish(descs []rawDesc, link bool) uint16 {
	d.t.Helper()
	for i, desc := range descs {
		b := make([]byte, 16)
		binary.LittleEndian.PutUint64(b, uint64(desc.addr))
		binary.LittleEndian.PutUint32(b[8:], desc.len)
		flags, next := desc.flags, desc.next
		if link && i < len(descs)-1 {
			flags |= descFNext
			next = uint16(i + 1)
		}
		binary.LittleEndian.PutUint16(b[12:], flags)
		binary.LittleEndian.PutUint16(b[14:], next)
		d.mem.Write(tdDesc+memory.GPA(16*i), b)
	}
	usedBefore, _ := d.mem.AtomicUint16(tdUsed + 2)
	d.mem.AtomicPutUint16(tdAvail+4+2*memory.GPA(d.availIdx%tdQSize), 0)
	d.availIdx++
	d.mem.AtomicPutUint16(tdAvail+2, d.availIdx)
	return usedBefore
}

// usedSince returns the used length of the one request the device used
// since the used index was usedBefore, or ok=false when it used none.
func (d *testDriver) usedSince(usedBefore uint16) (uint32, bool) {
	d.t.Helper()
	usedAfter, _ := d.mem.AtomicUint16(tdUsed + 2)
	if usedAfter == usedBefore {
		return 0, false
	}
	if usedAfter != usedBefore+1 {
		d.t.Fatalf("used idx moved from %d to %d for one request", usedBefore, usedAfter)
	}
	elem := tdUsed + 4 + 8*memory.GPA(usedBefore%tdQSize)
	id, _ := d.mem.Uint32(elem)
	n, _ := d.mem.Uint32(elem + 4)
	if id != 0 {
		d.t.Fatalf("used id %d, want head 0", id)
	}
	return n, true
}

func (d *testDriver) header(typ uint32, sector uint64) rawDesc {
	h := make([]byte, 16)
	binary.LittleEndian.PutUint32(h, typ)
	binary.LittleEndian.PutUint64(h[8:], sector)
	d.mem.Write(tdHeader, h)
	return rawDesc{addr: tdHeader, len: 16}
}

func (d *testDriver) status() rawDesc {
	d.mem.PutUint8(tdStatus, 0xff)
	return rawDesc{addr: tdStatus, len: 1, flags: descFWrite}
}

func (d *testDriver) statusByte() uint8 { b, _ := d.mem.Uint8(tdStatus); return b }

// write writes p at sector through the device and returns the status.
func (d *testDriver) write(sector uint64, p []byte) uint8 {
	d.mem.Write(tdData, p)
	d.submit([]rawDesc{d.header(BlkTypeOut, sector), {addr: tdData, len: uint32(len(p))}, d.status()}, true)
	return d.statusByte()
}

// read reads n bytes at sector through the device.
func (d *testDriver) read(sector uint64, n int) ([]byte, uint8, uint32) {
	d.mem.Write(tdData, make([]byte, n))
	used, _ := d.submit([]rawDesc{d.header(BlkTypeIn, sector), {addr: tdData, len: uint32(n), flags: descFWrite}, d.status()}, true)
	p := make([]byte, n)
	d.mem.Read(tdData, p)
	return p, d.statusByte(), used
}

func pattern(n int, seed byte) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(i*31) ^ seed
	}
	return p
}

func TestVirtioBlkNegotiatesAndReportsItsConfig(t *testing.T) {
	d := newTestDriver(t, 4096, 1<<20)
	if d.reg(mmioMagicValue) != virtioMagic || d.reg(mmioVersion) != 2 || d.reg(mmioDeviceID) != VirtioBlkDeviceID {
		t.Fatal("identification registers")
	}
	d.setReg(mmioDeviceFeaturesSel, 0)
	low := d.reg(mmioDeviceFeatures)
	d.setReg(mmioDeviceFeaturesSel, 1)
	high := d.reg(mmioDeviceFeatures)
	if low != FeatureSegMax|FeatureBlkSize|FeatureFlush || high != 1 {
		t.Errorf("features %#x:%#x, want SEG_MAX|BLK_SIZE|FLUSH and VERSION_1", high, low)
	}
	if d.reg(mmioConfig) != (1<<20)/512 || d.reg(mmioConfig+4) != 0 || d.reg(mmioConfig+12) != blkQueueSize-2 || d.reg(mmioConfig+20) != 4096 {
		t.Errorf("config capacity %d seg_max %d blk_size %d", d.reg(mmioConfig), d.reg(mmioConfig+12), d.reg(mmioConfig+20))
	}
	d.setReg(mmioQueueSel, 0)
	if d.reg(mmioQueueNumMax) != blkQueueSize {
		t.Error("queue max size")
	}
	// A driver without VERSION_1 (a legacy driver) is refused.
	d.setReg(mmioStatus, StatusAcknowledge|StatusDriver)
	d.setReg(mmioDriverFeaturesSel, 0)
	d.setReg(mmioDriverFeatures, FeatureFlush)
	d.setReg(mmioStatus, StatusAcknowledge|StatusDriver|StatusFeaturesOK)
	if d.reg(mmioStatus)&StatusFeaturesOK != 0 {
		t.Error("FEATURES_OK accepted without VERSION_1")
	}
	d.setUp(FeatureVersion1 | FeatureFlush | FeatureBlkSize)
}

func TestVirtioBlkWritesAndReadsInPlace(t *testing.T) {
	d := newTestDriver(t, 4096, 1<<20)
	d.setUp(FeatureVersion1 | FeatureFlush | FeatureBlkSize)
	want := pattern(16384, 7)
	if st := d.write(8, want); st != BlkStatusOK {
		t.Fatalf("write status %d", st)
	}
	file, _ := os.ReadFile(d.disk)
	if !bytes.Equal(file[8*512:8*512+16384], want) {
		t.Error("file does not hold the written data")
	}
	d.mem.Regions()[0].Dirty().Take()
	got, st, used := d.read(8, 16384)
	if st != BlkStatusOK || !bytes.Equal(got, want) || used != 16384+1 {
		t.Errorf("read status %d, used len %d, data equal %v", st, used, bytes.Equal(got, want))
	}
	dirty := d.mem.Regions()[0].Dirty()
	if !dirty.IsDirty(uint64(tdData)/memory.PageSize) || !dirty.IsDirty(uint64(tdStatus)/memory.PageSize) {
		t.Error("pages the device wrote are not marked dirty")
	}
	if d.irq.n.Load() == 0 || d.reg(mmioInterruptStatus)&1 == 0 {
		t.Error("no used-buffer interrupt")
	}
	d.setReg(mmioInterruptACK, 1)
	if d.reg(mmioInterruptStatus) != 0 {
		t.Error("interrupt not acknowledged")
	}
}

func TestVirtioBlkUnalignedRequestsUseReadModifyWrite(t *testing.T) {
	d := newTestDriver(t, 4096, 1<<20)
	d.setUp(FeatureVersion1)
	base := pattern(3*4096, 1)
	if st := d.write(0, base); st != BlkStatusOK {
		t.Fatal(st)
	}
	// 3 sectors from sector 7: the end of block 0 and the start of block 1.
	patch := pattern(1536, 99)
	if st := d.write(7, patch); st != BlkStatusOK {
		t.Fatalf("unaligned write status %d", st)
	}
	want := bytes.Clone(base)
	copy(want[7*512:], patch)
	file, _ := os.ReadFile(d.disk)
	if !bytes.Equal(file[:3*4096], want) {
		t.Error("read-modify-write damaged the neighbouring sectors")
	}
	got, st, _ := d.read(3, 4096+512) // unaligned head and tail
	if st != BlkStatusOK || !bytes.Equal(got, want[3*512:3*512+4096+512]) {
		t.Errorf("unaligned read status %d", st)
	}
}

func TestVirtioBlkGetIDAndFlush(t *testing.T) {
	d := newTestDriver(t, 512, 1<<20)
	d.setUp(FeatureVersion1 | FeatureFlush)
	used, _ := d.submit([]rawDesc{d.header(BlkTypeGetID, 0), {addr: tdData, len: 20, flags: descFWrite}, d.status()}, true)
	id := make([]byte, 20)
	d.mem.Read(tdData, id)
	if d.statusByte() != BlkStatusOK || strings.TrimRight(string(id), "\x00") != "tern-disk-0" || used != 21 {
		t.Errorf("GET_ID status %d id %q used %d", d.statusByte(), id, used)
	}
	d.submit([]rawDesc{d.header(BlkTypeFlush, 0), d.status()}, true)
	if d.statusByte() != BlkStatusOK {
		t.Errorf("flush status %d", d.statusByte())
	}
	d.submit([]rawDesc{d.header(99, 0), d.status()}, true)
	if d.statusByte() != BlkStatusUnsupp {
		t.Errorf("unknown type status %d", d.statusByte())
	}
}

func TestVirtioBlkAnswersBadDescriptorsWithIOError(t *testing.T) {
	d := newTestDriver(t, 4096, 1<<20)
	d.setUp(FeatureVersion1 | FeatureFlush)
	ok := func() rawDesc { return rawDesc{addr: tdData, len: 512, flags: descFWrite} }
	cases := []struct {
		name  string
		descs func() []rawDesc
		link  bool
	}{
		{"data outside RAM", func() []rawDesc {
			return []rawDesc{d.header(BlkTypeIn, 0), {addr: 8 << 20, len: 512, flags: descFWrite}, d.status()}
		}, true},
		{"data straddling the end of RAM", func() []rawDesc {
			return []rawDesc{d.header(BlkTypeIn, 0), {addr: 4<<20 - 256, len: 512, flags: descFWrite}, d.status()}
		}, true},
		{"read into a device-readable buffer", func() []rawDesc {
			return []rawDesc{d.header(BlkTypeIn, 0), {addr: tdData, len: 512}, d.status()}
		}, true},
		{"write from a device-writable buffer", func() []rawDesc {
			return []rawDesc{d.header(BlkTypeOut, 0), ok(), d.status()}
		}, true},
		{"short header", func() []rawDesc {
			h := d.header(BlkTypeIn, 0)
			h.len = 8
			return []rawDesc{h, ok(), d.status()}
		}, true},
		{"writable header", func() []rawDesc {
			h := d.header(BlkTypeIn, 0)
			h.flags = descFWrite
			return []rawDesc{h, ok(), d.status()}
		}, true},
		{"past the end of the disk", func() []rawDesc {
			return []rawDesc{d.header(BlkTypeIn, 2047), {addr: tdData, len: 1024, flags: descFWrite}, d.status()}
		}, true},
		{"sector beyond the disk", func() []rawDesc {
			return []rawDesc{d.header(BlkTypeIn, 1<<62), ok(), d.status()}
		}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			used, done := d.submit(c.descs(), c.link)
			if !done || d.statusByte() != BlkStatusIOErr || used != 1 {
				t.Errorf("used %v len %d status %d, want the chain used with an IO error", done, used, d.statusByte())
			}
		})
	}
	// Chains the device cannot even answer are returned with no status.
	unanswerable := []struct {
		name  string
		descs []rawDesc
	}{
		{"descriptor loop", []rawDesc{{addr: tdHeader, len: 16, flags: descFNext, next: 1}, {addr: tdStatus, len: 1, flags: descFWrite | descFNext, next: 0}}},
		{"next beyond the queue", []rawDesc{{addr: tdHeader, len: 16, flags: descFNext, next: tdQSize}}},
		{"indirect", []rawDesc{{addr: tdHeader, len: 16, flags: descFIndirect}}},
		{"no writable status", []rawDesc{{addr: tdHeader, len: 16, flags: descFNext, next: 1}, {addr: tdData, len: 1}}},
	}
	for _, c := range unanswerable {
		t.Run(c.name, func(t *testing.T) {
			d.header(BlkTypeIn, 0)
			d.status()
			used, done := d.submit(c.descs, false)
			if !done || used != 0 || d.statusByte() != 0xff {
				t.Errorf("used %v len %d status %#x, want returned untouched", done, used, d.statusByte())
			}
		})
	}
	// The device still serves good requests afterwards.
	if st := d.write(0, pattern(4096, 3)); st != BlkStatusOK || d.dev.Status()&StatusNeedsReset != 0 {
		t.Errorf("after bad requests: status %d, device status %#x", st, d.dev.Status())
	}
}

func TestVirtioMMIORefusesRingsOutsideRAM(t *testing.T) {
	d := newTestDriver(t, 4096, 1<<20)
	d.setReg(mmioStatus, StatusAcknowledge|StatusDriver)
	d.setReg(mmioQueueSel, 0)
	d.setReg(mmioQueueNum, tdQSize)
	d.setReg(mmioQueueDescLow, uint32(tdDesc))
	d.setReg(mmioQueueDriverLow, 0xfff00000) // outside RAM
	d.setReg(mmioQueueDeviceLow, uint32(tdUsed))
	d.setReg(mmioQueueReady, 1)
	if d.reg(mmioQueueReady) != 0 || d.reg(mmioStatus)&StatusNeedsReset == 0 {
		t.Error("a queue outside RAM was made ready")
	}
	d.setReg(mmioStatus, 0)
	if d.reg(mmioStatus) != 0 {
		t.Error("reset did not clear NEEDS_RESET")
	}
	d.setUp(FeatureVersion1)
}

func TestVirtioMMIORaisesAnUnacknowledgedInterruptAgain(t *testing.T) {
	d := newTestDriver(t, 4096, 1<<20)
	d.setUp(FeatureVersion1 | FeatureBlkSize)
	if ok, _ := d.dev.RaiseUnacknowledged(0); ok {
		t.Fatal("raised with nothing used")
	}
	if st := d.write(0, pattern(4096, 1)); st != BlkStatusOK {
		t.Fatalf("write status %d", st)
	}
	raised := d.irq.n.Load()
	if ok, _ := d.dev.RaiseUnacknowledged(time.Hour); ok || d.irq.n.Load() != raised {
		t.Fatal("raised again before the interval")
	}
	if ok, err := d.dev.RaiseUnacknowledged(0); !ok || err != nil || d.irq.n.Load() != raised+1 {
		t.Fatalf("an unacknowledged used buffer was not raised again: %v, %v, %d interrupts", ok, err, d.irq.n.Load())
	}
	d.setReg(mmioInterruptACK, d.reg(mmioInterruptStatus))
	if ok, _ := d.dev.RaiseUnacknowledged(0); ok {
		t.Fatal("raised again after the driver's acknowledgement")
	}
	// The state a migration carries keeps the watch on an unacknowledged
	// status.
	if st := d.write(0, pattern(4096, 2)); st != BlkStatusOK {
		t.Fatalf("write status %d", st)
	}
	if err := d.dev.SetState(d.dev.State()); err != nil {
		t.Fatal(err)
	}
	if ok, _ := d.dev.RaiseUnacknowledged(0); !ok {
		t.Fatal("a restored unacknowledged status was not raised again")
	}
}
