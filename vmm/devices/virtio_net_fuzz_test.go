package devices

import (
	"encoding/binary"
	"testing"

	"tern/vmm/memory"
)

// FuzzVirtioNetChains feeds a random descriptor table, available ring and
// buffer bytes to both of virtio-net's chain decoders: every transmit
// chain is gathered and its header checked (txFrame), every receive chain
// takes a frame (rxFill). Neither may panic; a frame txFrame returns holds
// an Ethernet header and fits MaxFrameBytes, and rxFill either fails or
// reports the header and the whole frame written.
func FuzzVirtioNetChains(f *testing.F) {
	seed := make([]byte, 16*ndQSize+64)
	binary.LittleEndian.PutUint64(seed[0:], uint64(ndTxBuf))
	binary.LittleEndian.PutUint32(seed[8:], NetHeaderSize)
	binary.LittleEndian.PutUint16(seed[12:], descFNext)
	binary.LittleEndian.PutUint16(seed[14:], 1)
	binary.LittleEndian.PutUint64(seed[16:], uint64(ndTxBuf+NetHeaderSize))
	binary.LittleEndian.PutUint32(seed[24:], 60)
	f.Add(seed, uint16(1), uint16(60))
	rx := make([]byte, 16*ndQSize)
	binary.LittleEndian.PutUint64(rx[0:], uint64(ndRxBuf))
	binary.LittleEndian.PutUint32(rx[8:], 1526)
	binary.LittleEndian.PutUint16(rx[12:], descFWrite)
	f.Add(rx, uint16(0x8000), uint16(1514))
	f.Add(make([]byte, 16*ndQSize), uint16(7), uint16(0))
	mem, err := memory.New(memory.RegionSpec{Name: "ram", Size: 1 << 20})
	if err != nil {
		f.Fatal(err)
	}
	defer mem.Close()
	txBuf := make([]byte, NetHeaderSize+MaxFrameBytes)
	frame := make([]byte, MaxFrameBytes)
	f.Fuzz(func(t *testing.T, table []byte, heads uint16, frameLen uint16) {
		mem.Write(0, make([]byte, 1<<20))
		mem.Write(ndTxDesc, table[:min(len(table), 16*ndQSize)])
		if len(table) > 16*ndQSize {
			mem.Write(ndTxBuf, table[16*ndQSize:min(len(table), 16*ndQSize+4096)])
		}
		n := heads%8 + 1
		for i := range n {
			head := uint16(0)
			if len(table) > int(i)*2+1 {
				head = binary.LittleEndian.Uint16(table[2*i:]) % (ndQSize + 4) // some out of range
			}
			mem.AtomicPutUint16(ndTxAvail+4+2*memory.GPA(i), head)
		}
		mem.AtomicPutUint16(ndTxAvail+2, n)
		vq, err := newVirtqueue(mem, ndQSize, ndTxDesc, ndTxAvail, ndTxUsed)
		if err != nil {
			t.Fatal(err)
		}
		receive := heads&0x8000 != 0
		for {
			head, ok, err := vq.Pop()
			if err != nil || !ok {
				break
			}
			if receive {
				chain, err := vq.Chain(head)
				if err != nil {
					continue
				}
				written, err := rxFill(mem, chain, frame[:int(frameLen)%(MaxFrameBytes+1)])
				if err == nil && written != uint32(NetHeaderSize+int(frameLen)%(MaxFrameBytes+1)) {
					t.Fatalf("rxFill reported %d bytes for a %d-byte frame", written, frameLen)
				}
				vq.PushUsed(head, written)
				continue
			}
			chain, err := vq.Chain(head)
			if err != nil {
				continue
			}
			out, err := txFrame(mem, chain, txBuf)
			if err == nil && (len(out) < ethHeaderSize || len(out) > MaxFrameBytes) {
				t.Fatalf("txFrame returned a %d-byte frame", len(out))
			}
			vq.PushUsed(head, 0)
		}
	})
}
