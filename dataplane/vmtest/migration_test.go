package vmtest

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"tern/dataplane"
	"tern/dataplane/nettest"
	"tern/dataplane/planetest"
	"tern/instance/apiv1"
	"tern/migration"
	"tern/vmm"
	"tern/vmm/devices"
	"tern/vmm/guests"
	"tern/vmm/kvm/kvmtest"
	"tern/vmm/memory"
	"tern/volume/transport/transporttest"
)

// The udp guest on two CPUs of the emulated host: it polls its card on
// one, the planes, the sender and the migration share the other.
func TestMain(m *testing.M) { kvmtest.Main(m, kvmtest.WithEmulatedCPUs(2)) }

// generous bounds every wait; nothing asserts on time.
const generous = 2 * time.Minute

var (
	senderIP = netip.MustParseAddr("10.7.0.1")
	moverIP  = netip.MustParseAddr("10.7.0.2")
	moverMAC = net.HardwareAddr{0x52, 0x54, 0, 0x74, 0, 2}
)

// The mover's TAP, the same name on its source and its target host (each
// host a namespace of its own).
const (
	// emulatedRate is the sender's datagrams a second in the emulated
	// test host, where the guest cannot take NumberedRate.
	emulatedRate = 100

	moverID  = "mover"
	moverTAP = "mover0"
	seqPort  = 9000
)

// TestLiveMigrationOfAVMLosesNothingOutsideItsDowntime live-migrates the
// udp guest, a VM on a virtio-net card whose TAP is a data-plane port,
// from host B to host C while a VM stand-in on host A sends it 1,000
// numbered datagrams a second through the eBPF path (VXLAN across the
// rack). The target's TAP and port are ready while the source still runs
// (the migration's Build); when the migration completes, C and B apply
// the moved mapping at once and A only after B has re-encapsulated 300 of
// A's datagrams toward C, as a slow agent would. The guest itself counts
// what arrived; the target's mark word, set while the source is paused,
// tells it which of its stalls is the migration's (the downtime as the
// guest saw it) and so which gap between arrivals the migration made (the
// run's longest gap may be a busy machine's). Its counts migrate with its
// memory and it reports them on the target.
//
// It asserts that nothing is lost outside the migration's gap (every
// missing run lies strictly inside it), that the last datagram sent
// arrived, that the old host forwarded (the wait for its 300) and that the
// guest echoes before and after. The loss, the gap, the
// guest's stall, the migration's own downtime and the gap less the stall
// (the target: at most 10 ms) are logged, not asserted, and
// recorded in docs/benchmarks.md.
//
// In the emulated test host (a machine without /dev/kvm) the guest's
// CPL0 code is emulated by TCG and cannot take 1,000 datagrams a second:
// on 2026-12-06 it lost 4,117 of 8,911, most before the migration. There
// the sender sends emulatedRate a second and the test asserts the weaker
// property that holds there: nothing is lost after the migration's gap
// (every datagram sent after the guest resumed arrives).
func TestLiveMigrationOfAVMLosesNothingOutsideItsDowntime(t *testing.T) {
	kvmtest.Require(t)
	r := planetest.NewRack(t)
	a, b, c := planetest.AddHost(t, r, "a"), planetest.AddHost(t, r, "b"), planetest.AddHost(t, r, "c")
	pa, pb, pc := planetest.NewPlane(t, a, dataplane.AttachAuto), planetest.NewPlane(t, b, dataplane.AttachAuto), planetest.NewPlane(t, c, dataplane.AttachAuto)
	sender, err := r.AddVM(a, "vm7a", senderIP, net.HardwareAddr{0x52, 0x54, 0, 0x74, 0, 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := pa.AttachPort(dataplane.Port{InstanceID: "vm7a", Device: sender.Device, MAC: sender.MAC, VNI: 7, IP: senderIP}); err != nil {
		t.Fatal(err)
	}
	if err := sender.NS.Neighbor("eth0", moverIP, dataplane.DefaultRouterMAC); err != nil {
		t.Fatal(err)
	}
	on := func(h *nettest.Host) []dataplane.Mapping {
		return []dataplane.Mapping{
			{VNI: 7, IP: senderIP, InstanceID: "vm7a", Underlay: a.Underlay},
			{VNI: 7, IP: moverIP, InstanceID: moverID, Underlay: h.Underlay},
		}
	}
	planetest.Apply(t, on(b), pa, pb, pc)

	// The source: the udp guest on host B, its TAP a port of B's plane.
	cfg := vmm.Config{Guest: "udp", MemoryBytes: kvmtest.Sized[uint64](64<<20, 16<<20), NICs: []vmm.NIC{{TAP: moverTAP, MAC: moverMAC}}}
	var src *vmm.VM
	if err := b.NS.Do(func() (err error) { src, err = vmm.New(cfg); return err }); err != nil {
		t.Fatalf("vmm.New on host b: %v", err)
	}
	srcRun := run(t, src)
	srcCon := devices.NewHistoryLines(src.Serial().Output(), 0)
	defer srcCon.Close()
	waitLine(t, srcCon, "udp: ready mac "+moverMAC.String())
	attachMover(t, b, pb)

	// The path works both ways before anything moves: the guest echoes.
	echoConn := planetest.UDPConn(t, sender, 9002)
	if err := nettest.RoundTrip(echoConn, netip.AddrPortFrom(moverIP, guests.UDPEchoPort), []byte("before"), generous); err != nil {
		t.Fatalf("echo from host a to the guest on host b: %v", err)
	}

	rate := kvmtest.Sized(nettest.NumberedRate, emulatedRate)
	send := nettest.SendNumberedAt(planetest.UDPConn(t, sender, 9001), netip.AddrPortFrom(moverIP, seqPort), guests.UDPMaxSeq, rate)
	defer send.Stop()
	planetest.WaitCounter(t, pb, dataplane.Counters{}, dataplane.CounterDelivered, uint64(rate))

	// The migration, over QUIC with mutual TLS on loopback. The target
	// is built in C's namespace, where its TAP is made, and its port
	// attached there before the source pauses.
	var (
		mu      sync.Mutex
		dst     *vmm.VM
		dstRun  *running
		pauseAt time.Time
	)
	tc := migration.TargetConfig{
		Build: func(_ []byte, mem *memory.Memory) (*vmm.VM, error) {
			var vm *vmm.VM
			if err := c.NS.Do(func() (err error) { vm, err = vmm.NewMigrationTarget(cfg, mem); return err }); err != nil {
				return nil, fmt.Errorf("building the target on host c: %w", err)
			}
			if err := c.NS.Up(moverTAP); err != nil {
				vm.Close()
				return nil, err
			}
			if err := pc.AttachPort(moverPort()); err != nil {
				vm.Close()
				return nil, err
			}
			return vm, nil
		},
		Start: func(vm *vmm.VM) {
			mu.Lock()
			defer mu.Unlock()
			dst, dstRun = vm, start(vm)
		},
		// Every page is in, the card's state applied and the source
		// paused: the mark tells the guest that the stall it is in is
		// the migration's, and which frames its card had received by
		// then (those below the receive queue's used index).
		BeforeFinish: func(context.Context) error {
			mu.Lock()
			defer mu.Unlock()
			rx := dst.VirtioNets()[0].Transport().State().Queues[0]
			used, err := dst.Memory().AtomicUint16(memory.GPA(rx.Device) + 2)
			if err != nil {
				return fmt.Errorf("reading the card's receive used index: %w", err)
			}
			return dst.Memory().PutUint64(guests.ParamsAddr+guests.MarkOffset, guests.UDPMark(used))
		},
	}
	sc := migration.SourceConfig{VM: src, Spec: []byte("{}"), OnProgress: func(p apiv1.Progress) {
		if p.Phase == apiv1.PhasePause {
			mu.Lock()
			pauseAt = time.Now()
			mu.Unlock()
		}
	}}
	srcConn, dstConn := transporttest.Pair(t, migration.NextProto)
	ctx, cancel := context.WithTimeout(t.Context(), generous)
	defer cancel()
	var (
		wg     sync.WaitGroup
		dstErr error
	)
	wg.Go(func() { _, _, dstErr = migration.Receive(ctx, dstConn, tc) })
	res, err := migration.Send(ctx, srcConn, sc)
	// The migration completed: the control plane moves the mapping, and
	// the target's and the source's hosts apply it first.
	if err == nil {
		planetest.Apply(t, on(c), pc, pb)
	}
	switchedAt := time.Now()
	wg.Wait()
	mu.Lock()
	if dstRun != nil {
		t.Cleanup(func() { dstRun.stop(t) })
	}
	mu.Unlock()
	if err != nil || dstErr != nil {
		t.Fatalf("migration: Send: %v; Receive: %v", err, dstErr)
	}
	if err := pb.DetachPort(moverID); err != nil {
		t.Fatal(err)
	}
	srcRun.stop(t)
	fwdBefore := planetest.Counters(t, pb)
	planetest.WaitCounter(t, pb, fwdBefore, dataplane.CounterForwarded, 300)
	planetest.Apply(t, on(c), pa)
	direct := planetest.Counters(t, pc)
	planetest.WaitCounter(t, pc, direct, dataplane.CounterDelivered, uint64(rate))
	sent, err := send.Stop()
	if err != nil {
		t.Fatal(err)
	}
	if err := nettest.RoundTrip(echoConn, netip.AddrPortFrom(moverIP, guests.UDPEchoPort), []byte("after"), generous); err != nil {
		t.Fatalf("echo from host a to the guest migrated to host c: %v", err)
	}

	// The guest's own count, from the target, once it has seen the last
	// datagram sent.
	_, end := dst.Serial().Output().Bounds()
	dstCon := devices.NewHistoryLines(dst.Serial().Output(), end)
	defer dstCon.Close()
	var rep guests.UDPReport
	for request := uint32(1); ; request++ {
		rep = report(t, dst, dstCon, request)
		if rep.Highest == uint64(sent-1) {
			break
		}
		if request == 50 {
			t.Fatalf("after %d reports the guest's highest datagram is %d; %d were sent: %+v", request, rep.Highest, sent, rep)
		}
	}
	if rep.First != 0 || rep.More {
		t.Errorf("report %+v: want the first datagram first and every missing run listed", rep)
	}
	if rep.MarkedStall == 0 || rep.MarkedUntil <= rep.MarkedAfter {
		t.Fatalf("report %+v: the guest saw no marked stall, or no arrival after it", rep)
	}
	for _, run := range rep.Missing {
		switch {
		case run[1] >= rep.MarkedUntil:
			t.Errorf("datagrams %d-%d were lost after the migration's gap (after %d, until %d): %+v", run[0], run[1], rep.MarkedAfter, rep.MarkedUntil, rep)
		case run[0] <= rep.MarkedAfter && !kvmtest.Inside():
			t.Errorf("datagrams %d-%d were lost before the migration's gap (after %d, until %d): %+v", run[0], run[1], rep.MarkedAfter, rep.MarkedUntil, rep)
		}
	}
	fwd := planetest.Counters(t, pb)[dataplane.CounterForwarded] - fwdBefore[dataplane.CounterForwarded]
	mu.Lock()
	window := switchedAt.Sub(pauseAt)
	mu.Unlock()
	t.Logf("%d of %d datagrams lost; the migration's gap %v (after %d, until %d), its stall (the downtime the guest saw) %v, gap - stall %v; "+
		"the migration's downtime %v, its pause to the mapping applied on b and c %v; %d forwarded by host b; "+
		"the longest gap of the run %v (after %d, until %d), the longest stall %v",
		rep.Lost(), sent, rep.MarkedGap, rep.MarkedAfter, rep.MarkedUntil, rep.MarkedStall, rep.MarkedGap-rep.MarkedStall,
		res.Downtime, window, fwd, rep.Gap, rep.GapAfter, rep.GapUntil, rep.Stall)
}

func moverPort() dataplane.Port {
	return dataplane.Port{InstanceID: moverID, Device: moverTAP, MAC: moverMAC, VNI: 7, IP: moverIP}
}

// attachMover brings the mover's TAP up on h and makes it a port of p.
func attachMover(t *testing.T, h *nettest.Host, p *dataplane.Plane) {
	t.Helper()
	if err := h.NS.Up(moverTAP); err != nil {
		t.Fatal(err)
	}
	if err := p.AttachPort(moverPort()); err != nil {
		t.Fatal(err)
	}
}

// report asks the udp guest for its report (request is the new value of
// its verify-request word) and returns it parsed.
func report(t *testing.T, vm *vmm.VM, con *devices.HistoryLines, request uint32) guests.UDPReport {
	t.Helper()
	if err := vm.Memory().AtomicPutUint32(guests.ParamsAddr+guests.VerifyRequestOffset, request); err != nil {
		t.Fatal(err)
	}
	lines := []string{waitPrefix(t, con, guests.UDPReportFirstLine)}
	for lines[len(lines)-1] != guests.UDPReportEnd {
		lines = append(lines, waitPrefix(t, con, ""))
	}
	rep, err := guests.ParseUDPReport(lines)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

func waitLine(t *testing.T, con *devices.HistoryLines, want string) {
	t.Helper()
	if got := waitPrefix(t, con, want); got != want {
		t.Fatalf("the guest printed %q; want %q", got, want)
	}
}

// waitPrefix returns the guest's next line that starts with prefix.
func waitPrefix(t *testing.T, con *devices.HistoryLines, prefix string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), generous)
	defer cancel()
	for {
		line, err := con.NextLine(ctx)
		if err != nil {
			t.Fatalf("waiting for a line %q from the udp guest: %v", prefix, err)
		}
		if strings.HasPrefix(line, prefix) {
			return line
		}
	}
}

// running is a VM whose Run the test owns.
type running struct {
	vm   *vmm.VM
	done chan error
}

func start(vm *vmm.VM) *running {
	r := &running{vm: vm, done: make(chan error, 1)}
	go func() {
		_, err := vm.Run(context.Background())
		r.done <- err
	}()
	return r
}

// run starts vm; the cleanup stops and closes it, if the test has not.
func run(t *testing.T, vm *vmm.VM) *running {
	r := start(vm)
	t.Cleanup(func() { r.stop(t) })
	return r
}

// stop stops the VM, waits for its Run and closes it; again is a no-op.
func (r *running) stop(t *testing.T) {
	t.Helper()
	if r.vm == nil {
		return
	}
	r.vm.Stop()
	select {
	case <-r.done:
	case <-time.After(generous):
		t.Errorf("the VM's Run did not return within %v of Stop", generous)
	}
	if err := r.vm.Close(); err != nil {
		t.Errorf("closing the VM: %v", err)
	}
	r.vm = nil
}
