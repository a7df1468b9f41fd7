package devices

import (
	"encoding/binary"
	"testing"

	"tern/vmm/memory"
)

// FuzzVirtioBlkDescriptors feeds a random descriptor table, available ring
// and request header to a running virtio-blk device: it must never panic,
// and it must return. (No stronger invariant holds: a chain may point the
// device's writes at the rings themselves, as a hostile guest may.)
func FuzzVirtioBlkDescriptors(f *testing.F) {
	seed := make([]byte, 16*tdQSize+16+4)
	binary.LittleEndian.PutUint64(seed[0:], uint64(tdHeader))
	binary.LittleEndian.PutUint32(seed[8:], 16)
	binary.LittleEndian.PutUint16(seed[12:], descFNext)
	binary.LittleEndian.PutUint16(seed[14:], 1)
	binary.LittleEndian.PutUint64(seed[16:], uint64(tdStatus))
	binary.LittleEndian.PutUint32(seed[24:], 1)
	binary.LittleEndian.PutUint16(seed[28:], descFWrite)
	f.Add(seed, uint16(1))
	f.Add(make([]byte, 16*tdQSize), uint16(3))
	d := newTestDriver(f, 4096, 64<<10)
	d.setUp(FeatureVersion1 | FeatureFlush | FeatureBlkSize)
	f.Fuzz(func(t *testing.T, table []byte, heads uint16) {
		d.mem.Write(tdAvail, make([]byte, 2*memory.PageSize))
		d.availIdx = 0
		d.t = t
		d.setUp(FeatureVersion1 | FeatureFlush | FeatureBlkSize)
		table = table[:min(len(table), 16*tdQSize+16+4)]
		d.mem.Write(tdDesc, make([]byte, 16*tdQSize))
		d.mem.Write(tdDesc, table[:min(len(table), 16*tdQSize)])
		if len(table) > 16*tdQSize {
			d.mem.Write(tdHeader, table[16*tdQSize:])
		}
		n := heads%8 + 1
		for i := range n {
			head := uint16(0)
			if len(table) > int(i)*2+1 {
				head = binary.LittleEndian.Uint16(table[2*i:]) % (tdQSize + 4) // some out of range
			}
			d.mem.AtomicPutUint16(tdAvail+4+2*memory.GPA(d.availIdx%tdQSize), head)
			d.availIdx++
		}
		d.mem.AtomicPutUint16(tdAvail+2, d.availIdx)
		d.setReg(mmioQueueNotify, 0)
	})
}
