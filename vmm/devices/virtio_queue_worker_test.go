package devices

import (
	"bytes"
	"context"
	"errors"
	"os"
	"sync"
	"testing"
	"time"

	"tern/internal/blockio"
	"tern/internal/testwait"
	"tern/vmm/kvm"
)

// eventfdIRQ is an Interrupt that signals an eventfd, as an irqfd's is.
type eventfdIRQ struct{ e *kvm.EventFD }

func (i eventfdIRQ) Trigger() error { return i.e.Signal() }

// eventfdNotifiers opens a real eventfd per queue; the test signals it
// where KVM would on the guest's QueueNotify write.
type eventfdNotifiers struct {
	t *testing.T
	// fail makes Notifier fail.
	fail bool

	mu sync.Mutex
	// opened are the eventfds opened, in order; closed counts Closes.
	opened []*kvm.EventFD
	closed int
	// waiting has, per notifier opened, a channel closed at its first
	// Read: its worker has made its first pass over the queue and waits
	// to be kicked.
	waiting []chan struct{}
}

func (n *eventfdNotifiers) Notifier(q int) (Notifier, error) {
	if n.fail {
		return nil, errors.New("no ioeventfd here")
	}
	e, err := kvm.NewEventFD()
	if err != nil {
		return nil, err
	}
	n.t.Cleanup(func() { e.Close() })
	n.mu.Lock()
	defer n.mu.Unlock()
	n.opened = append(n.opened, e)
	waiting := make(chan struct{})
	n.waiting = append(n.waiting, waiting)
	return closeCounter{EventFD: e, n: n, waiting: waiting, once: &sync.Once{}}, nil
}

// closeCounter counts its eventfd's Close and says when its worker first
// waits on it.
type closeCounter struct {
	*kvm.EventFD
	n       *eventfdNotifiers
	waiting chan struct{}
	once    *sync.Once
}

func (c closeCounter) Read() (uint64, error) {
	c.once.Do(func() { close(c.waiting) })
	return c.EventFD.Read()
}

// awaitWorkerWaiting waits until the newest notifier's worker has made
// its first pass over the queue (which serves whatever is already
// available) and waits to be kicked: only then does a request published
// afterwards wait for a kick, whatever the scheduler did.
func (n *eventfdNotifiers) awaitWorkerWaiting() {
	n.t.Helper()
	n.mu.Lock()
	w := n.waiting[len(n.waiting)-1]
	n.mu.Unlock()
	awaitDone(n.t, "the queue's worker to wait on its notifier", w)
}

func (c closeCounter) Close() error {
	c.n.mu.Lock()
	c.n.closed++
	c.n.mu.Unlock()
	return c.EventFD.Close()
}

// counts returns how many notifiers were opened and closed.
func (n *eventfdNotifiers) counts() (opened, closed int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.opened), n.closed
}

// kick signals the newest notifier, as KVM does for the guest's write.
func (n *eventfdNotifiers) kick() {
	n.t.Helper()
	n.mu.Lock()
	e := n.opened[len(n.opened)-1]
	n.mu.Unlock()
	if err := e.Signal(); err != nil {
		n.t.Fatal(err)
	}
}

// gatedBackend holds each Flush until the test releases it.
type gatedBackend struct {
	blockio.Device
	entered chan struct{} // receives when a Flush has begun
	release chan struct{} // a send lets one Flush return
}

func (b *gatedBackend) Flush(ctx context.Context) error {
	b.entered <- struct{}{}
	<-b.release
	return b.Device.Flush(ctx)
}

// asyncDriver is a test driver of a transport on the asynchronous path,
// its interrupt an eventfd.
type asyncDriver struct {
	*testDriver
	notifiers *eventfdNotifiers
	irqfd     *kvm.EventFD
	blk       *VirtioBlk
}

func newAsyncDriver(t *testing.T, wrap func(blockio.Device) blockio.Device) *asyncDriver {
	t.Helper()
	d, backend := newTestDisk(t, 512, 1<<20)
	var be blockio.Device = backend
	if wrap != nil {
		be = wrap(be)
	}
	irqfd, err := kvm.NewEventFD()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { irqfd.Close() })
	a := &asyncDriver{testDriver: d, notifiers: &eventfdNotifiers{t: t}, irqfd: irqfd, blk: NewVirtioBlk(be, "tern-disk-0", d.mem)}
	d.dev = NewAsyncVirtioMMIO(context.Background(), a.blk, d.mem, eventfdIRQ{irqfd}, a.notifiers)
	t.Cleanup(func() { d.dev.Close() })
	return a
}

// awaitInterrupt waits for the device's interrupt eventfd to count.
func (a *asyncDriver) awaitInterrupt(what string) {
	a.t.Helper()
	got := make(chan error, 1)
	go func() {
		_, err := a.irqfd.Read()
		got <- err
	}()
	select {
	case err := <-got:
		if err != nil {
			a.t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		a.t.Fatalf("no interrupt within 10s: %s", what)
	}
}

// awaitDone waits for c to close or receive, failing after a generous bound.
func awaitDone[T any](t *testing.T, what string, c <-chan T) T {
	t.Helper()
	select {
	case v := <-c:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("not within 10s: %s", what)
		var zero T
		return zero
	}
}

func TestAsyncQueueIsServedOnItsWorkerWokenByItsNotifier(t *testing.T) {
	a := newAsyncDriver(t, nil)
	// The queue's notifier opens once it is ready on a running device,
	// not before.
	a.setReg(mmioStatus, 0)
	a.setReg(mmioStatus, StatusAcknowledge|StatusDriver)
	if opened, _ := a.notifiers.counts(); opened != 0 {
		t.Fatalf("%d notifiers opened before the queue was ready", opened)
	}
	a.setUp(FeatureVersion1 | FeatureFlush)
	if opened, closed := a.notifiers.counts(); opened != 1 || closed != 0 {
		t.Fatalf("notifiers opened %d, closed %d after set-up; want 1, 0", opened, closed)
	}
	a.notifiers.awaitWorkerWaiting()
	want := pattern(4096, 5)
	a.mem.Write(tdData, want)
	before := a.publish([]rawDesc{a.header(BlkTypeOut, 8), {addr: tdData, len: 4096}, a.status()}, true)
	// A QueueNotify write that reaches the transport (KVM's ioeventfd
	// takes the guest's) is not served on the writer's goroutine.
	a.setReg(mmioQueueNotify, 0)
	if _, used := a.usedSince(before); used {
		t.Fatal("the request was served on the notifying goroutine")
	}
	a.notifiers.kick()
	a.awaitInterrupt("the worker serving the kicked write")
	// The used-buffer bit was set before the interrupt.
	if a.reg(mmioInterruptStatus)&interruptUsedBuffer == 0 {
		t.Fatal("interrupt raised without the used-buffer bit")
	}
	if n, used := a.usedSince(before); !used || n != 1 || a.statusByte() != BlkStatusOK {
		t.Fatalf("used %v len %d status %d; want the write done", used, n, a.statusByte())
	}
	a.setReg(mmioInterruptACK, interruptUsedBuffer)
	if a.reg(mmioInterruptStatus) != 0 {
		t.Fatal("InterruptACK did not clear the bit")
	}
	file, _ := os.ReadFile(a.disk)
	if !bytes.Equal(file[8*512:8*512+4096], want) {
		t.Fatal("the disk does not hold the write")
	}
}

func TestQuiesceWaitsForTheFlushInFlightAndHoldsTheNextRequest(t *testing.T) {
	gate := &gatedBackend{entered: make(chan struct{}), release: make(chan struct{})}
	a := newAsyncDriver(t, func(b blockio.Device) blockio.Device { gate.Device = b; return gate })
	a.setUp(FeatureVersion1 | FeatureFlush)
	before := a.publish([]rawDesc{a.header(BlkTypeFlush, 0), a.status()}, true)
	a.notifiers.kick()
	awaitDone(t, "the backend's Flush to begin", gate.entered)
	// FLUSH completes only once the backend's Flush has returned.
	if _, used := a.usedSince(before); used || a.statusByte() != 0xff {
		t.Fatal("the flush was completed to the driver before the backend's Flush returned")
	}
	quiesced := make(chan error, 1)
	go func() { quiesced <- a.dev.Quiesce(context.Background()) }()
	select {
	case err := <-quiesced:
		t.Fatalf("Quiesce returned (%v) with a flush in flight", err)
	default:
	}
	gate.release <- struct{}{}
	if err := awaitDone(t, "Quiesce after the flush returned", quiesced); err != nil {
		t.Fatal(err)
	}
	if _, used := a.usedSince(before); !used || a.statusByte() != BlkStatusOK {
		t.Fatalf("after Quiesce the flush is not complete: status %d", a.statusByte())
	}
	a.awaitInterrupt("the flush's completion")
	// Quiesced, a kicked request waits.
	before = a.publish([]rawDesc{a.header(BlkTypeGetID, 0), {addr: tdData, len: 20, flags: descFWrite}, a.status()}, true)
	a.notifiers.kick()
	if err := a.dev.Quiesce(context.Background()); err != nil {
		t.Fatalf("Quiesce of a quiesced transport: %v", err)
	}
	if _, used := a.usedSince(before); used {
		t.Fatal("a request was served while quiesced")
	}
	state := a.dev.State()
	a.dev.Resume()
	a.awaitInterrupt("the request held by Quiesce, after Resume")
	if _, used := a.usedSince(before); !used || a.statusByte() != BlkStatusOK {
		t.Fatalf("after Resume: status %d", a.statusByte())
	}
	if len(state.Queues) != 1 || !state.Queues[0].Ready {
		t.Fatalf("State while quiesced = %+v", state)
	}
	// A context that ends first fails Quiesce, holding nothing.
	gate2 := a.publish([]rawDesc{a.header(BlkTypeFlush, 0), a.status()}, true)
	a.notifiers.kick()
	awaitDone(t, "the second Flush to begin", gate.entered)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := a.dev.Quiesce(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Quiesce with an ended context = %v, want context.Canceled", err)
	}
	gate.release <- struct{}{}
	a.awaitInterrupt("the second flush")
	if _, used := a.usedSince(gate2); !used {
		t.Fatal("the second flush was not completed")
	}
}

func TestResetAndCloseStopTheWorkers(t *testing.T) {
	before := testwait.Running()
	a := newAsyncDriver(t, nil)
	a.setUp(FeatureVersion1)
	a.setReg(mmioStatus, 0) // reset
	if opened, closed := a.notifiers.counts(); opened != 1 || closed != 1 {
		t.Fatalf("after reset: notifiers opened %d, closed %d; want 1, 1", opened, closed)
	}
	a.setUp(FeatureVersion1)
	// Disabling the queue stops its worker too.
	a.setReg(mmioQueueSel, 0)
	a.setReg(mmioQueueReady, 0)
	if opened, closed := a.notifiers.counts(); opened != 2 || closed != 2 {
		t.Fatalf("after QueueReady 0: notifiers opened %d, closed %d; want 2, 2", opened, closed)
	}
	a.setUp(FeatureVersion1)
	a.notifiers.awaitWorkerWaiting()
	if st := a.write(0, pattern(512, 1)); st != 0xff {
		t.Fatalf("status %#x right after the write: served synchronously", st)
	}
	a.notifiers.kick()
	a.awaitInterrupt("the write")
	if err := a.dev.Close(); err != nil {
		t.Fatal(err)
	}
	if opened, closed := a.notifiers.counts(); opened != 3 || closed != 3 {
		t.Fatalf("after Close: notifiers opened %d, closed %d; want 3, 3", opened, closed)
	}
	// Close waited for each worker to signal its end; each goroutine
	// returns a moment after that: wait for every one the transport
	// started to be gone.
	before.Returned(t, 10*time.Second)
	// No worker starts after Close.
	a.setUp(FeatureVersion1)
	if opened, _ := a.notifiers.counts(); opened != 3 {
		t.Fatalf("a notifier opened after Close")
	}
}

func TestAQueueWhoseNotifierFailsIsServedSynchronously(t *testing.T) {
	a := newAsyncDriver(t, nil)
	a.notifiers.fail = true
	a.setUp(FeatureVersion1)
	if st := a.write(0, pattern(512, 2)); st != BlkStatusOK {
		t.Fatalf("write status %d; want it served on the notifying goroutine", st)
	}
}

func TestAsyncStateMovesToAnotherTransportWhichServesWhatWasPending(t *testing.T) {
	a := newAsyncDriver(t, nil)
	a.setUp(FeatureVersion1 | FeatureFlush)
	if err := a.dev.Quiesce(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Kicked on the source while quiesced: never served there.
	want := pattern(1024, 9)
	a.mem.Write(tdData, want)
	before := a.publish([]rawDesc{a.header(BlkTypeOut, 2), {addr: tdData, len: 1024}, a.status()}, true)
	a.notifiers.kick()
	st := a.dev.State()
	if err := a.dev.Close(); err != nil {
		t.Fatal(err)
	}
	if _, used := a.usedSince(before); used {
		t.Fatal("the quiesced source served the request")
	}
	irqfd, err := kvm.NewEventFD()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { irqfd.Close() })
	target := &asyncDriver{testDriver: a.testDriver, notifiers: &eventfdNotifiers{t: t}, irqfd: irqfd}
	target.dev = NewAsyncVirtioMMIO(context.Background(), a.blk, a.mem, eventfdIRQ{irqfd}, target.notifiers)
	t.Cleanup(func() { target.dev.Close() })
	if err := target.dev.SetState(st); err != nil {
		t.Fatal(err)
	}
	// The target's worker serves it with no new kick.
	target.awaitInterrupt("the target's first pass over the queue")
	if _, used := target.usedSince(before); !used || target.statusByte() != BlkStatusOK {
		t.Fatalf("the target did not serve the pending write: status %d", target.statusByte())
	}
	file, _ := os.ReadFile(a.disk)
	if !bytes.Equal(file[2*512:2*512+1024], want) {
		t.Fatal("the disk does not hold the pending write")
	}
}

// BenchmarkVirtioBlkRoundTrip measures one 4 KiB write from the driver's
// notify to its completion seen by the driver: synchronous (served in
// the notifying goroutine), and asynchronous (a real eventfd wakes the
// queue's worker, whose completion signals the interrupt eventfd the
// driver waits on), which is the cost the ioeventfd path adds per request
// outside KVM.
func BenchmarkVirtioBlkRoundTrip(b *testing.B) {
	req := func(d *testDriver) {
		d.mem.Write(tdData, pattern(4096, 1))
	}
	b.Run("sync", func(b *testing.B) {
		d := newTestDriver(b, 4096, 1<<20)
		d.setUp(FeatureVersion1)
		req(d)
		b.ReportAllocs()
		b.SetBytes(4096)
		for b.Loop() {
			if _, used := d.submit([]rawDesc{d.header(BlkTypeOut, 0), {addr: tdData, len: 4096}, d.status()}, true); !used {
				b.Fatal("not served")
			}
		}
	})
	b.Run("async", func(b *testing.B) {
		d, backend := newTestDisk(b, 4096, 1<<20)
		irqfd, err := kvm.NewEventFD()
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { irqfd.Close() })
		kick, err := kvm.NewEventFD()
		if err != nil {
			b.Fatal(err)
		}
		d.dev = NewAsyncVirtioMMIO(context.Background(), NewVirtioBlk(backend, "tern-disk-0", d.mem), d.mem, eventfdIRQ{irqfd}, oneNotifier{kick})
		b.Cleanup(func() { d.dev.Close() })
		d.setUp(FeatureVersion1)
		req(d)
		b.ReportAllocs()
		b.SetBytes(4096)
		for b.Loop() {
			before := d.publish([]rawDesc{d.header(BlkTypeOut, 0), {addr: tdData, len: 4096}, d.status()}, true)
			if err := kick.Signal(); err != nil {
				b.Fatal(err)
			}
			if _, err := irqfd.Read(); err != nil {
				b.Fatal(err)
			}
			if _, used := d.usedSince(before); !used {
				b.Fatal("interrupt without the request served")
			}
		}
	})
}

// oneNotifier hands its one eventfd to the one queue.
type oneNotifier struct{ e *kvm.EventFD }

func (n oneNotifier) Notifier(int) (Notifier, error) { return n.e, nil }
