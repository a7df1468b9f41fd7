package vmm

import (
	"encoding/binary"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"tern/internal/blockio"
	"tern/internal/testwait"
	"tern/vmm/devices"
	"tern/vmm/kvm/kvmtest"
	"tern/vmm/tap/taptest"
)

func TestNICMACIsStableUnicastAndLocallyAdministered(t *testing.T) {
	a, b := NICMAC("tap0"), NICMAC("tap1")
	if a.String() != NICMAC("tap0").String() {
		t.Error("the same name gave two addresses")
	}
	if a.String() == b.String() {
		t.Errorf("tap0 and tap1 both got %v", a)
	}
	if err := ValidateMAC(a); err != nil {
		t.Error(err)
	}
	if !strings.HasPrefix(a.String(), "52:54:00:") || a[0]&2 == 0 {
		t.Errorf("%v: want 52:54:00:xx:xx:xx, locally administered", a)
	}
}

func TestValidateNICsReportsEachProblem(t *testing.T) {
	mac := func(s string) net.HardwareAddr {
		m, err := net.ParseMAC(s)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	for _, c := range []struct {
		name string
		nics []NIC
		want []string
	}{
		{"fine", []NIC{{TAP: "tap0"}, {TAP: "tap1", MAC: mac("52:54:00:12:34:56")}}, nil},
		{"too many", []NIC{{TAP: "a"}, {TAP: "b"}, {TAP: "c"}, {TAP: "d"}, {TAP: "e"}}, []string{"nics: 5 given, at most 4"}},
		{"bad names", []NIC{{TAP: ""}, {TAP: "a/b"}, {TAP: strings.Repeat("x", 16)}}, []string{"empty interface name", "holds '/'", "longer than 15"}},
		{"tap twice", []NIC{{TAP: "tap0"}, {TAP: "tap0", MAC: mac("52:54:00:00:00:01")}}, []string{"nics[1]: tap tap0 is nics[0]'s too"}},
		{"bad MACs", []NIC{{TAP: "a", MAC: mac("01:00:5e:00:00:01")}, {TAP: "b", MAC: mac("00:00:00:00:00:00")}, {TAP: "c", MAC: net.HardwareAddr{2, 0, 0}}},
			[]string{"nics[0]: MAC 01:00:5e:00:00:01 is a multicast address", "nics[1]: MAC 00:00:00:00:00:00 is all zero", "nics[2]: MAC 02:00:00 is 3 bytes"}},
		{"MAC twice", []NIC{{TAP: "a", MAC: NICMAC("b")}, {TAP: "b"}}, []string{"nics[1]: MAC " + NICMAC("b").String() + " is nics[0]'s too"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := Config{NICs: c.nics}
			errs := cfg.validateNICs()
			if len(errs) != len(c.want) {
				t.Fatalf("errors %q; want %d", errs, len(c.want))
			}
			for i, err := range errs {
				if !strings.Contains(err.Error(), c.want[i]) {
					t.Errorf("error %q does not say %q", err, c.want[i])
				}
			}
		})
	}
}

// receiveGoroutines counts virtio-net receive goroutines.
func receiveGoroutines() int {
	buf := make([]byte, 1<<20)
	return strings.Count(string(buf[:runtime.Stack(buf, true)]), "devices.(*VirtioNet).receive(")
}

func TestNICSitsInItsSlotOnItsTAPUntilClose(t *testing.T) {
	kvmtest.Require(t)
	ns := taptest.New(t)
	given := NICMAC("other")
	var vm *VM
	// The VM opens its TAPs in the namespace of the thread that builds it.
	err := ns.Do(func() (err error) {
		vm, err = New(Config{Guest: "hello", MemoryBytes: 64 << 20,
			NICs: []NIC{{TAP: "tvm0"}, {TAP: "tvm1", MAC: given}}})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer vm.Close()
	for j, want := range []net.HardwareAddr{NICMAC("tvm0"), given} {
		base := VirtioSlotAddr(NICSlot(j))
		b := make([]byte, 4)
		vm.mmio.Read(base+8, b) // DeviceID
		if id := binary.LittleEndian.Uint32(b); id != devices.VirtioNetDeviceID {
			t.Errorf("slot %d: device ID %d; want virtio-net's", NICSlot(j), id)
		}
		mac := make([]byte, 6)
		vm.mmio.Read(base+0x100, mac[:4])
		vm.mmio.Read(base+0x104, mac[4:])
		if net.HardwareAddr(mac).String() != want.String() {
			t.Errorf("nic %d: config MAC %v; want %v", j, net.HardwareAddr(mac), want)
		}
	}
	tapExists := func(name string) bool {
		found := false
		ns.Do(func() error { _, err := net.InterfaceByName(name); found = err == nil; return nil })
		return found
	}
	if !tapExists("tvm0") || !tapExists("tvm1") {
		t.Fatal("the VM's TAPs are not in the namespace")
	}
	if n := receiveGoroutines(); n != 2 {
		t.Errorf("%d receive goroutines; want one per card", n)
	}
	if err := vm.Close(); err != nil {
		t.Fatal(err)
	}
	// The TAPs were created by the VM, so they go with its descriptors.
	if tapExists("tvm0") || tapExists("tvm1") {
		t.Error("the TAPs the VM created outlived it")
	}
	// Close returns once each receive goroutine signalled its end; each
	// returns a moment later.
	testwait.For(t, 10*time.Second, "every card's receive goroutine to return after Close", func() bool { return receiveGoroutines() == 0 })
}

func TestNICSlotsAreInUseForTheDSDT(t *testing.T) {
	cfg := Config{Disks: make([]blockio.Device, 2), NICs: []NIC{{TAP: "a"}, {TAP: "b"}}}
	got := cfg.virtioSlotsInUse()
	want := []int{0, 1, NICSlot(0), NICSlot(1)}
	if len(got) != len(want) {
		t.Fatalf("slots %v; want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("slots %v; want %v", got, want)
		}
	}
}
