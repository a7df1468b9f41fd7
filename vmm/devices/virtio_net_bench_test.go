package devices

import (
	"testing"
	"time"
)

// BenchmarkVirtioNetTransmit sends 1514-byte frames from the driver's
// transmit queue out of a real TAP: gather, header check, TAP write.
func BenchmarkVirtioNetTransmit(b *testing.B) {
	d := newNetDriver(b)
	d.setUp()
	frame := testFrame(peerMAC, testMAC, string(make([]byte, 1500)))
	chain := d.txChain([NetHeaderSize]byte{}, frame, true)
	b.ReportAllocs()
	b.SetBytes(int64(len(frame)))
	for b.Loop() {
		d.send(chain...)
	}
	if s := d.dev.Stats(); s.TxDropped != 0 {
		b.Fatalf("stats %+v: frames dropped", s)
	}
}

// BenchmarkVirtioNetReceive sends 1514-byte frames into a real TAP and
// waits for each in the driver's receive buffer, which it then reposts:
// TAP read, delivery, interrupt.
func BenchmarkVirtioNetReceive(b *testing.B) {
	d := newNetDriver(b)
	d.setUp()
	frame := testFrame(testMAC, peerMAC, string(make([]byte, 1500)))
	b.ReportAllocs()
	b.SetBytes(int64(len(frame)))
	for b.Loop() {
		d.rx.post(rawDesc{addr: ndRxBuf, len: 2048, flags: descFWrite})
		d.setReg(mmioQueueNotify, netRxQueue)
		if err := d.peer.Send(frame); err != nil {
			b.Fatal(err)
		}
		deadline := time.After(ndWait)
	wait:
		for {
			if _, _, ok := d.rx.next(); ok {
				break wait
			}
			select {
			case <-d.irq:
			case <-deadline:
				b.Fatalf("no frame in %v", ndWait)
			}
		}
	}
}
