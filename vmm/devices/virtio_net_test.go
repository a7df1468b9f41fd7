package devices

import (
	"bytes"
	"context"
	"encoding/binary"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"tern/internal/testwait"
	"tern/vmm/memory"
	"tern/vmm/tap/taptest"
)

// Guest-physical layout of the network test driver: the two queues'
// rings, then buffers.
const (
	ndRxDesc  memory.GPA = 0x10000
	ndRxAvail memory.GPA = 0x11000
	ndRxUsed  memory.GPA = 0x12000
	ndTxDesc  memory.GPA = 0x13000
	ndTxAvail memory.GPA = 0x14000
	ndTxUsed  memory.GPA = 0x15000
	ndRxBuf   memory.GPA = 0x20000 // rx buffer i at ndRxBuf + i*0x1000
	ndTxBuf   memory.GPA = 0x40000
	ndQSize              = 16
	// ndWait bounds every wait for the device or the kernel.
	ndWait = 10 * time.Second
)

// testEtherType is IEEE's local experimental EtherType: the kernel sends
// nothing of its own with it, so tests recognise their frames.
const testEtherType = 0x88b5

var testMAC = net.HardwareAddr{0x52, 0x54, 0x00, 0x12, 0x34, 0x56}

// signalIRQ is an Interrupt that tests wait on.
type signalIRQ chan struct{}

func (s signalIRQ) Trigger() error {
	select {
	case s <- struct{}{}:
	default:
	}
	return nil
}

// ring is the driver's side of one split virtqueue in guest memory.
type ring struct {
	mem                *memory.Memory
	desc, avail, used  memory.GPA
	availIdx, nextDesc uint16
	usedSeen           uint16
}

// post writes descs as one chain into free table slots, publishes its
// head and returns it.
func (r *ring) post(descs ...rawDesc) uint16 {
	head := r.nextDesc
	for i, d := range descs {
		slot := (head + uint16(i)) % ndQSize
		b := make([]byte, 16)
		binary.LittleEndian.PutUint64(b, uint64(d.addr))
		binary.LittleEndian.PutUint32(b[8:], d.len)
		flags, next := d.flags, uint16(0)
		if i < len(descs)-1 {
			flags |= descFNext
			next = (slot + 1) % ndQSize
		}
		binary.LittleEndian.PutUint16(b[12:], flags)
		binary.LittleEndian.PutUint16(b[14:], next)
		r.mem.Write(r.desc+memory.GPA(16*slot), b)
	}
	r.nextDesc = (head + uint16(len(descs))) % ndQSize
	r.mem.AtomicPutUint16(r.avail+4+2*memory.GPA(r.availIdx%ndQSize), head)
	r.availIdx++
	r.mem.AtomicPutUint16(r.avail+2, r.availIdx)
	return head
}

// next returns the next used entry, if the device pushed one.
func (r *ring) next() (id uint32, n uint32, ok bool) {
	idx, _ := r.mem.AtomicUint16(r.used + 2)
	if idx == r.usedSeen {
		return 0, 0, false
	}
	elem := r.used + 4 + 8*memory.GPA(r.usedSeen%ndQSize)
	id, _ = r.mem.Uint32(elem)
	n, _ = r.mem.Uint32(elem + 4)
	r.usedSeen++
	return id, n, true
}

// netDriver drives a VirtioNet over a real TAP in a namespace of its own,
// as a guest driver would; peer is the TAP's host side.
type netDriver struct {
	t      testing.TB
	mem    *memory.Memory
	dev    *VirtioNet
	irq    signalIRQ
	peer   *taptest.Peer
	rx, tx *ring
}

func newNetDriver(t testing.TB) *netDriver {
	t.Helper()
	return newNetDriverWith(t, nil)
}

// newNetDriverWith is newNetDriver with the transport's queues on workers
// woken by notifiers (nil: synchronous).
func newNetDriverWith(t testing.TB, notifiers Notifiers) *netDriver {
	t.Helper()
	ns := taptest.New(t)
	mem, err := memory.New(memory.RegionSpec{Name: "ram", Size: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mem.Close() })
	backend := ns.OpenTAP(t, "tap0")
	irq := make(signalIRQ, 1)
	dev, err := NewAsyncVirtioNet(backend, testMAC, mem, irq, notifiers)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	return &netDriver{t: t, mem: mem, dev: dev, irq: irq, peer: ns.Peer(t, "tap0"),
		rx: &ring{mem: mem, desc: ndRxDesc, avail: ndRxAvail, used: ndRxUsed},
		tx: &ring{mem: mem, desc: ndTxDesc, avail: ndTxAvail, used: ndTxUsed}}
}

func (d *netDriver) reg(off uint64) uint32 {
	b := make([]byte, 4)
	d.dev.Transport().ReadMMIO(off, b)
	return binary.LittleEndian.Uint32(b)
}

func (d *netDriver) setReg(off uint64, v uint32) {
	d.dev.Transport().WriteMMIO(off, binary.LittleEndian.AppendUint32(nil, v))
}

// setUp runs the virtio 1.x initialization with both queues.
func (d *netDriver) setUp() {
	d.t.Helper()
	features := uint64(FeatureVersion1 | FeatureNetMAC)
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
	for q, r := range []*ring{d.rx, d.tx} {
		d.setReg(mmioQueueSel, uint32(q))
		d.setReg(mmioQueueNum, ndQSize)
		d.setReg(mmioQueueDescLow, uint32(r.desc))
		d.setReg(mmioQueueDriverLow, uint32(r.avail))
		d.setReg(mmioQueueDeviceLow, uint32(r.used))
		d.setReg(mmioQueueReady, 1)
	}
	d.setReg(mmioStatus, StatusAcknowledge|StatusDriver|StatusFeaturesOK|StatusDriverOK)
	if d.reg(mmioStatus)&StatusNeedsReset != 0 {
		d.t.Fatal("queues not accepted")
	}
}

// postRx posts receive buffer i (one writable descriptor of n bytes) and
// notifies queue 0.
func (d *netDriver) postRx(i int, n uint32) {
	d.rx.post(rawDesc{addr: ndRxBuf + memory.GPA(i)*0x1000, len: n, flags: descFWrite})
	d.setReg(mmioQueueNotify, netRxQueue)
}

// waitRx waits for the device to use the next receive buffer.
func (d *netDriver) waitRx(what string) (id, n uint32) {
	d.t.Helper()
	deadline := time.After(ndWait)
	for {
		if id, n, ok := d.rx.next(); ok {
			return id, n
		}
		select {
		case <-d.irq:
		case <-deadline:
			d.t.Fatalf("waiting %v for %s in a receive buffer: the device used none", ndWait, what)
		}
	}
}

// send posts descs on the transmit queue, notifies, and returns the used
// length of the chain, which the device serves before the notify returns.
func (d *netDriver) send(descs ...rawDesc) uint32 {
	d.t.Helper()
	head := d.tx.post(descs...)
	d.setReg(mmioQueueNotify, netTxQueue)
	id, n, ok := d.tx.next()
	if !ok || id != uint32(head) {
		d.t.Fatalf("transmit chain %d not used (got %d, %v)", head, id, ok)
	}
	return n
}

// testFrame is an Ethernet frame of the test EtherType from src to dst.
func testFrame(dst, src net.HardwareAddr, payload string) []byte {
	f := append(append(append([]byte{}, dst...), src...), testEtherType>>8, testEtherType&0xff)
	return append(f, payload...)
}

func isTestFrame(f []byte) bool {
	return len(f) >= 14 && f[12] == testEtherType>>8 && f[13] == testEtherType&0xff
}

var peerMAC = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x99}

// txChain lays out a header and frame in guest memory at ndTxBuf as two
// descriptors (split) or one.
func (d *netDriver) txChain(hdr [NetHeaderSize]byte, frame []byte, split bool) []rawDesc {
	d.mem.Write(ndTxBuf, hdr[:])
	d.mem.Write(ndTxBuf+NetHeaderSize, frame)
	if split {
		return []rawDesc{{addr: ndTxBuf, len: NetHeaderSize}, {addr: ndTxBuf + NetHeaderSize, len: uint32(len(frame))}}
	}
	return []rawDesc{{addr: ndTxBuf, len: uint32(NetHeaderSize + len(frame))}}
}

func TestVirtioNetNegotiatesAndReportsItsMAC(t *testing.T) {
	d := newNetDriver(t)
	if d.reg(mmioMagicValue) != virtioMagic || d.reg(mmioVersion) != 2 || d.reg(mmioDeviceID) != VirtioNetDeviceID {
		t.Fatal("identification registers")
	}
	d.setReg(mmioDeviceFeaturesSel, 0)
	low := d.reg(mmioDeviceFeatures)
	d.setReg(mmioDeviceFeaturesSel, 1)
	high := d.reg(mmioDeviceFeatures)
	if low != FeatureNetMAC|FeatureNetStatus || high != 1 {
		t.Errorf("features %#x:%#x, want MAC|STATUS and VERSION_1 (no offloads)", high, low)
	}
	cfg := make([]byte, 8)
	d.dev.Transport().ReadMMIO(mmioConfig, cfg)
	if !bytes.Equal(cfg[:6], testMAC) || binary.LittleEndian.Uint16(cfg[6:]) != netLinkUp {
		t.Errorf("config % x; want the MAC then link up", cfg)
	}
	for q := range 2 {
		d.setReg(mmioQueueSel, uint32(q))
		if d.reg(mmioQueueNumMax) != netQueueSize {
			t.Errorf("queue %d max size %d", q, d.reg(mmioQueueNumMax))
		}
	}
	d.setReg(mmioQueueSel, 2)
	if d.reg(mmioQueueNumMax) != 0 {
		t.Error("a third queue (control) is offered")
	}
	if _, err := NewVirtioNet(nil, net.HardwareAddr{1, 2, 3}, d.mem, NoInterrupt{}); err == nil {
		t.Error("a 3-byte MAC was accepted")
	}
}

func TestVirtioNetTransmitsTheFrameAfterTheHeaderOutOfTheTAP(t *testing.T) {
	d := newNetDriver(t)
	d.setUp()
	for i, split := range []bool{true, false} {
		frame := testFrame(peerMAC, testMAC, strings.Repeat("x", 40+i))
		if n := d.send(d.txChain([NetHeaderSize]byte{}, frame, split)...); n != 0 {
			t.Errorf("transmit chain used with %d bytes written; want 0", n)
		}
		got, err := d.peer.Receive("the transmitted frame", isTestFrame, ndWait)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, frame) {
			t.Fatalf("split %v: TAP's host side got % x; want % x", split, got, frame)
		}
	}
	if s := d.dev.Stats(); s.TxFrames != 2 || s.TxDropped != 0 {
		t.Errorf("stats %+v; want 2 frames sent, none dropped", s)
	}
}

func TestVirtioNetDropsABadTransmitChainAndSendsTheNext(t *testing.T) {
	good := testFrame(peerMAC, testMAC, "the good one")
	for _, tc := range []struct {
		name  string
		chain func(d *netDriver) []rawDesc
	}{
		{"checksum offload asked", func(d *netDriver) []rawDesc {
			return d.txChain([NetHeaderSize]byte{1}, testFrame(peerMAC, testMAC, "needs csum"), true)
		}},
		{"segmentation asked", func(d *netDriver) []rawDesc {
			return d.txChain([NetHeaderSize]byte{0, 1}, testFrame(peerMAC, testMAC, "tso"), true)
		}},
		{"device-writable buffer", func(d *netDriver) []rawDesc {
			c := d.txChain([NetHeaderSize]byte{}, testFrame(peerMAC, testMAC, "writable"), true)
			c[1].flags = descFWrite
			return c
		}},
		{"shorter than an Ethernet header", func(d *netDriver) []rawDesc {
			return d.txChain([NetHeaderSize]byte{}, []byte{1, 2, 3}, true)
		}},
		{"header cut short", func(d *netDriver) []rawDesc {
			return []rawDesc{{addr: ndTxBuf, len: NetHeaderSize - 1}}
		}},
		{"buffer outside RAM", func(d *netDriver) []rawDesc {
			return []rawDesc{{addr: ndTxBuf, len: NetHeaderSize}, {addr: 1 << 40, len: 64}}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newNetDriver(t)
			d.setUp()
			d.send(tc.chain(d)...)
			d.send(d.txChain([NetHeaderSize]byte{}, good, false)...)
			// Frames leave in order: had the bad one gone out, it would
			// come first.
			got, err := d.peer.Receive("the good frame", isTestFrame, ndWait)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, good) {
				t.Fatalf("first frame out % x; want the good one", got)
			}
			if s := d.dev.Stats(); s.TxFrames != 1 || s.TxDropped != 1 {
				t.Errorf("stats %+v; want 1 sent, 1 dropped", s)
			}
		})
	}
}

// checkRx checks receive buffer i holds a header with no offload and
// num_buffers 1, then frame.
func (d *netDriver) checkRx(i int, n uint32, frame []byte) {
	d.t.Helper()
	if n != uint32(NetHeaderSize+len(frame)) {
		d.t.Fatalf("used length %d; want %d (header + frame)", n, NetHeaderSize+len(frame))
	}
	got := make([]byte, n)
	d.mem.Read(ndRxBuf+memory.GPA(i)*0x1000, got)
	want := make([]byte, NetHeaderSize)
	want[10] = 1 // num_buffers
	if !bytes.Equal(got[:NetHeaderSize], want) {
		d.t.Errorf("header % x; want % x", got[:NetHeaderSize], want)
	}
	if !bytes.Equal(got[NetHeaderSize:], frame) {
		d.t.Errorf("frame % x; want % x", got[NetHeaderSize:], frame)
	}
}

func TestVirtioNetReceivesAFrameFromTheTAPIntoABuffer(t *testing.T) {
	d := newNetDriver(t)
	d.setUp()
	d.postRx(0, NetHeaderSize+1514)
	frame := testFrame(testMAC, peerMAC, strings.Repeat("y", 1500))
	if err := d.peer.Send(frame); err != nil {
		t.Fatal(err)
	}
	id, n := d.waitRx("the frame sent into the TAP")
	if id != 0 {
		t.Errorf("used id %d; want 0", id)
	}
	d.checkRx(0, n, frame)

	// A buffer split across descriptors (header, then the rest) is
	// filled in order.
	d.rx.post(rawDesc{addr: ndRxBuf + 0x1000, len: 5, flags: descFWrite},
		rawDesc{addr: ndRxBuf + 0x1005, len: 2000, flags: descFWrite})
	d.setReg(mmioQueueNotify, netRxQueue)
	frame2 := testFrame(testMAC, peerMAC, "split")
	if err := d.peer.Send(frame2); err != nil {
		t.Fatal(err)
	}
	_, n = d.waitRx("the second frame")
	d.checkRx(1, n, frame2)
	if s := d.dev.Stats(); s.RxFrames != 2 || s.RxDropped != 0 {
		t.Errorf("stats %+v; want 2 received", s)
	}
}

func TestVirtioNetHoldsFramesUntilTheDriverPostsBuffers(t *testing.T) {
	d := newNetDriver(t)
	// Before the driver is running and with no buffer posted, frames
	// wait: the first in the device, the rest in the TAP.
	frames := [][]byte{testFrame(testMAC, peerMAC, "first"), testFrame(testMAC, peerMAC, "second"), testFrame(testMAC, peerMAC, "third")}
	for _, f := range frames {
		if err := d.peer.Send(f); err != nil {
			t.Fatal(err)
		}
	}
	d.setUp()
	for i, f := range frames {
		if _, _, ok := d.rx.next(); ok {
			t.Fatalf("frame %d placed with no buffer posted", i)
		}
		d.postRx(i, 2048) // one buffer at a time: the ring is full again after each
		_, n := d.waitRx("a held frame")
		d.checkRx(i, n, f)
	}
	if s := d.dev.Stats(); s.RxFrames != 3 || s.RxDropped != 0 {
		t.Errorf("stats %+v; want 3 received, none dropped", s)
	}
}

func TestVirtioNetDropsAFrameLongerThanItsBuffer(t *testing.T) {
	d := newNetDriver(t)
	d.setUp()
	d.postRx(0, NetHeaderSize+20)
	if err := d.peer.Send(testFrame(testMAC, peerMAC, strings.Repeat("z", 100))); err != nil {
		t.Fatal(err)
	}
	if _, n := d.waitRx("the too-long frame's buffer back"); n != 0 {
		t.Fatalf("a too-small buffer came back with %d bytes; want 0", n)
	}
	d.postRx(1, 2048)
	next := testFrame(testMAC, peerMAC, "fits")
	if err := d.peer.Send(next); err != nil {
		t.Fatal(err)
	}
	_, n := d.waitRx("the next frame")
	d.checkRx(1, n, next)
	if s := d.dev.Stats(); s.RxFrames != 1 || s.RxDropped != 1 {
		t.Errorf("stats %+v; want 1 received, 1 dropped", s)
	}
}

func TestVirtioNetPauseHoldsReceptionUntilResume(t *testing.T) {
	d := newNetDriver(t)
	d.setUp()
	d.dev.Pause()
	frame := testFrame(testMAC, peerMAC, "after resume")
	if err := d.peer.Send(frame); err != nil {
		t.Fatal(err)
	}
	d.postRx(0, 2048)
	if _, _, ok := d.rx.next(); ok {
		t.Fatal("a frame was placed while paused")
	}
	d.dev.Resume()
	_, n := d.waitRx("the frame held over the pause")
	d.checkRx(0, n, frame)
}

// receiveGoroutines counts goroutines in the receive loop.
func receiveGoroutines() int {
	buf := make([]byte, 1<<20)
	return strings.Count(string(buf[:runtime.Stack(buf, true)]), "devices.(*VirtioNet).receive(")
}

// waitReceiveReturned waits until no receive goroutine is left. Close
// returns once the goroutine closed rxDone, in its deferred call, after
// which it touches nothing Close frees; the goroutine itself returns a
// moment later, so a count taken at once may still see it (seen: 1 run
// in 90). Wait for it to be gone, bounded, instead of counting once.
func waitReceiveReturned(t *testing.T) {
	t.Helper()
	testwait.For(t, ndWait, "every receive goroutine to return after Close", func() bool { return receiveGoroutines() == 0 })
}

func TestVirtioNetCloseStopsItsReceiveGoroutine(t *testing.T) {
	if n := receiveGoroutines(); n != 0 {
		t.Fatalf("%d receive goroutines before the test", n)
	}
	for _, holding := range []bool{false, true} {
		d := newNetDriver(t)
		d.setUp()
		if holding { // the goroutine waits for a buffer, not on the TAP
			if err := d.peer.Send(testFrame(testMAC, peerMAC, "held")); err != nil {
				t.Fatal(err)
			}
		}
		if err := d.dev.Close(); err != nil {
			t.Fatalf("holding %v: Close: %v", holding, err)
		}
		waitReceiveReturned(t)
		if err := d.dev.Close(); err != nil {
			t.Errorf("second Close: %v", err)
		}
	}
}

func TestVirtioNetOnQueueWorkersSendsAndReceives(t *testing.T) {
	notifiers := &eventfdNotifiers{t: t}
	d := newNetDriverWith(t, notifiers)
	d.setUp()
	if opened, _ := notifiers.counts(); opened != 2 {
		t.Fatalf("%d notifiers opened; want one per queue", opened)
	}
	kick := func(q int) {
		notifiers.mu.Lock()
		e := notifiers.opened[q]
		notifiers.mu.Unlock()
		if err := e.Signal(); err != nil {
			t.Fatal(err)
		}
	}
	frame := testFrame(peerMAC, testMAC, "sent by a worker")
	d.tx.post(d.txChain([NetHeaderSize]byte{}, frame, true)...)
	kick(netTxQueue)
	got, err := d.peer.Receive("the frame the transmit worker sent", isTestFrame, ndWait)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, frame) {
		t.Fatalf("got % x; want % x", got, frame)
	}

	d.rx.post(rawDesc{addr: ndRxBuf, len: 2048, flags: descFWrite})
	kick(netRxQueue)
	in := testFrame(testMAC, peerMAC, "received beside a worker")
	if err := d.peer.Send(in); err != nil {
		t.Fatal(err)
	}
	_, n := d.waitRx("the frame, with the queues on workers")
	d.checkRx(0, n, in)
	if err := d.dev.Close(); err != nil {
		t.Fatal(err)
	}
	if opened, closed := notifiers.counts(); closed != opened {
		t.Errorf("%d of %d notifiers closed after Close", closed, opened)
	}
}

func TestVirtioNetQuiescedTransportHoldsReceptionAndCloseEndsTheWait(t *testing.T) {
	d := newNetDriver(t)
	d.setUp()
	d.postRx(0, 2048)
	if err := d.dev.Transport().Quiesce(context.Background()); err != nil {
		t.Fatal(err)
	}
	frame := testFrame(testMAC, peerMAC, "after the quiesce")
	if err := d.peer.Send(frame); err != nil {
		t.Fatal(err)
	}
	if _, _, ok := d.rx.next(); ok {
		t.Fatal("a frame was placed while quiesced")
	}
	d.dev.Transport().Resume()
	_, n := d.waitRx("the frame held over the quiesce")
	d.checkRx(0, n, frame)

	// Quiesced again with a frame waiting for it: Close still ends the
	// receive goroutine.
	d.postRx(1, 2048)
	if err := d.dev.Transport().Quiesce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := d.peer.Send(testFrame(testMAC, peerMAC, "never placed")); err != nil {
		t.Fatal(err)
	}
	closed := make(chan error, 1)
	go func() { closed <- d.dev.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(ndWait):
		t.Fatalf("Close of a quiesced card did not return within %v", ndWait)
	}
	waitReceiveReturned(t)
}
