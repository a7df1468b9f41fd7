package migration

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"tern/vmm"
	"tern/vmm/devices"
	"tern/vmm/guests"
	"tern/vmm/kvm/kvmtest"
	"tern/vmm/memory"
	"tern/vmm/tap/taptest"
)

// newTargetInNetns builds the migration target's VM on a thread inside
// the namespace s.TargetNetns, so that its TAPs are opened there.
func newTargetInNetns(s testSpec, mem *memory.Memory) (*vmm.VM, error) {
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		mem.Close()
		return nil, err
	}
	defer orig.Close()
	h, err := netns.GetFromName(s.TargetNetns)
	if err != nil {
		runtime.UnlockOSThread()
		mem.Close()
		return nil, err
	}
	defer h.Close()
	if err := netns.Set(h); err != nil {
		runtime.UnlockOSThread()
		mem.Close()
		return nil, err
	}
	vm, err := vmm.NewMigrationTarget(s.config(), mem)
	if serr := netns.Set(orig); serr != nil {
		return vm, fmt.Errorf("leaving network namespace %s: %w", s.TargetNetns, serr) // the thread dies locked
	}
	runtime.UnlockOSThread()
	return vm, err
}

// Virtio-mmio registers the test drives the card with (virtio 1.x 4.2.2).
const (
	regDriverFeatures    = 0x020
	regDriverFeaturesSel = 0x024
	regQueueSel          = 0x030
	regQueueNum          = 0x038
	regQueueReady        = 0x044
	regQueueNotify       = 0x050
	regStatus            = 0x070
	regQueueDescLow      = 0x080
	regQueueDriverLow    = 0x090
	regQueueDeviceLow    = 0x0a0
	nicQueueSize         = 8
)

// nicRings are the card's receive rings and one buffer in guest memory,
// above what the dirty guest patterns.
type nicRings struct{ desc, avail, used, buf memory.GPA }

// setUpCard runs a driver's initialization of the card's receive queue
// (the transmit queue left off) and posts one receive buffer.
func setUpCard(t *testing.T, vm *vmm.VM, r nicRings) {
	t.Helper()
	tr := vm.VirtioNets()[0].Transport()
	set := func(off uint64, v uint32) { tr.WriteMMIO(off, binary.LittleEndian.AppendUint32(nil, v)) }
	mem := vm.Memory()
	set(regStatus, 0)
	set(regStatus, devices.StatusAcknowledge|devices.StatusDriver)
	set(regDriverFeaturesSel, 1)
	set(regDriverFeatures, 1) // VERSION_1
	set(regStatus, devices.StatusAcknowledge|devices.StatusDriver|devices.StatusFeaturesOK)
	set(regQueueSel, 0)
	set(regQueueNum, nicQueueSize)
	set(regQueueDescLow, uint32(r.desc))
	set(regQueueDriverLow, uint32(r.avail))
	set(regQueueDeviceLow, uint32(r.used))
	set(regQueueReady, 1)
	desc := make([]byte, 16)
	binary.LittleEndian.PutUint64(desc, uint64(r.buf))
	binary.LittleEndian.PutUint32(desc[8:], 2048)
	binary.LittleEndian.PutUint16(desc[12:], 2) // device-writable
	mem.Write(r.desc, desc)
	mem.AtomicPutUint16(r.avail+4, 0)
	mem.AtomicPutUint16(r.avail+2, 1)
	set(regStatus, devices.StatusAcknowledge|devices.StatusDriver|devices.StatusFeaturesOK|devices.StatusDriverOK)
	set(regQueueNotify, 0)
}

func TestMigratedCardReceivesIntoTheBufferPostedOnTheSource(t *testing.T) {
	kvmtest.Require(t)
	srcNS, dstNS := taptest.New(t), taptest.New(t)
	const memBytes = 64 << 20
	spec := testSpec{Guest: "dirty", MemoryBytes: memBytes, VCPUs: 1,
		NICs: []vmm.NIC{{TAP: "tmig0"}}, TargetNetns: dstNS.Name}
	cfg := spec.config()
	cfg.Params = &guests.Params{MemStart: 4 << 20, MemBytes: memBytes - 8<<20, WorkingSetBytes: 1 << 20,
		Passes: guests.PassesForever, VerifyEverySec: 1}
	var vm *vmm.VM
	if err := srcNS.Do(func() (err error) { vm, err = vmm.New(cfg); return err }); err != nil {
		t.Fatalf("vmm.New: %v", err)
	}
	a := startVM(t, vm)
	newConsole(vm.Serial().Output(), 0).waitVerifyPass(t)
	top := memory.GPA(memBytes - 2<<20)
	rings := nicRings{desc: top, avail: top + 0x1000, used: top + 0x2000, buf: top + 0x3000}
	setUpCard(t, vm, rings)
	before := vm.VirtioNets()[0].Transport().State()

	m := &migration{src: SourceConfig{VM: a.vm, Spec: mustJSON(t, spec)}}
	m.run(t)
	if m.err != nil || m.dstErr != nil {
		t.Fatalf("Send: %v; Receive: %v", m.err, m.dstErr)
	}
	after := m.dstVM.VirtioNets()[0].Transport().State()
	if fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("the card's transport on the target %+v; the source's was %+v", after, before)
	}
	// A frame into the target's TAP lands in the buffer the driver posted
	// on the source.
	dstNS.Up(t, "tmig0")
	peer := dstNS.Peer(t, "tmig0")
	mac := vmm.NICMAC("tmig0")
	frame := append(append(append([]byte{}, mac...), 2, 0, 0, 0, 0, 9), 0x88, 0xb5)
	frame = append(frame, "after the move"...)
	if err := peer.Send(frame); err != nil {
		t.Fatal(err)
	}
	mem := m.dstVM.Memory()
	deadline := time.Now().Add(generous)
	for {
		if idx, _ := mem.AtomicUint16(rings.used + 2); idx == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no frame in the migrated card's receive buffer after %v", generous)
		}
		// tern's guests take no interrupt, so the used ring is the only
		// sign of the delivery: look again shortly, as goleak does.
		time.Sleep(time.Millisecond)
	}
	n, _ := mem.Uint32(rings.used + 4 + 4)
	got := make([]byte, n)
	mem.Read(rings.buf, got)
	if int(n) != devices.NetHeaderSize+len(frame) || !bytes.Equal(got[devices.NetHeaderSize:], frame) {
		t.Fatalf("receive buffer holds % x (%d bytes); want the header and % x", got, n, frame)
	}
}
