package vmm_test

import (
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"tern/vmm"
	"tern/vmm/internal/linuxtest"
	"tern/vmm/kvm/kvmtest"
	"tern/vmm/linuxguest"
	"tern/vmm/tap/taptest"
)

// The addresses of TestLinuxGuestPingsAcrossItsTAP's link.
const (
	netTestTAP     = "tern-lt0"
	netTestHostIP  = "10.77.0.1"
	netTestGuestIP = "10.77.0.2"
)

// TestLinuxGuestPingsAcrossItsTAP boots tern's Linux userland with one
// network card on a TAP whose host side has an address, and has the guest
// find its interface with the MAC tern gave it and ping the host: ARP and
// ICMP both ways through virtio-net's transmit and receive queues and the
// card's interrupt.
func TestLinuxGuestPingsAcrossItsTAP(t *testing.T) {
	kvmtest.Require(t)
	u := linuxtest.Userland(t)
	if linuxtest.UnderNestedPVM() {
		linuxtest.RunInEmulatedHost(t)
		return
	}
	mac := vmm.NICMAC(netTestTAP)
	cfg := vmm.Config{
		Linux:       &vmm.LinuxGuest{Kernel: u.Kernel, Initrd: u.Initrd, Cmdline: linuxguest.Cmdline},
		MemoryBytes: 256 << 20,
		NICs:        []vmm.NIC{{TAP: netTestTAP}},
	}
	// Inside the emulated host the machine is the test's own; elsewhere
	// the TAP and its address go in a namespace of the test's.
	var vm *vmm.VM
	build := func() (err error) {
		if vm, err = vmm.New(cfg); err != nil {
			return err
		}
		link, err := netlink.LinkByName(netTestTAP)
		if err != nil {
			return err
		}
		addr, err := netlink.ParseAddr(netTestHostIP + "/24")
		if err != nil {
			return err
		}
		if err := netlink.AddrAdd(link, addr); err != nil {
			return err
		}
		return netlink.LinkSetUp(link)
	}
	var err error
	if kvmtest.Inside() {
		err = build()
	} else {
		err = taptest.New(t).Do(build)
	}
	if vm != nil {
		t.Cleanup(func() { vm.Close() })
	}
	if err != nil {
		t.Fatalf("building the VM on %s: %v", netTestTAP, err)
	}
	sh := linuxtest.NewUARTShell(vm.Serial())
	defer sh.Close()
	done := startWithin(t, vm, 2*linuxBoot())
	sh.Limit = linuxBoot()
	start := time.Now()
	if err := sh.WaitReady(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Logf("ready after %.1fs", time.Since(start).Seconds())
	sh.Limit = kvmtest.Sized(generous, 4*time.Minute)
	run := func(cmd string) string {
		t.Helper()
		out, status, err := sh.Run(t.Context(), cmd)
		if err != nil {
			t.Fatal(err)
		}
		if status != 0 {
			t.Fatalf("%s: status %d, output:\n%s", cmd, status, out)
		}
		return out
	}
	ifname := ""
	for _, name := range strings.Fields(run("ls /sys/class/net")) {
		if name != "lo" {
			ifname = name
		}
	}
	if ifname == "" {
		t.Fatal("the guest has no network interface but lo")
	}
	if got := run("cat /sys/class/net/" + ifname + "/address"); got != mac.String() {
		t.Errorf("%s's MAC %q; want %v", ifname, got, mac)
	}
	run("ip addr add " + netTestGuestIP + "/24 dev " + ifname + " && ip link set " + ifname + " up")
	out := run("ping -c 3 -W 10 " + netTestHostIP)
	if !strings.Contains(out, "3 packets received") {
		t.Errorf("ping: %s; want 3 replies", out)
	}
	t.Logf("ping from the guest:\n%s", out)
	if err := sh.Type("exit 0"); err != nil {
		t.Fatal(err)
	}
	if r := wait(t, done); r.err != nil || r.status != 0 {
		t.Fatalf("Run = %d, %v; want 0; the console's last lines:\n%s", r.status, r.err, sh.Seen())
	}
	stats := vm.VirtioNets()[0].Stats()
	t.Logf("card: %+v", stats)
	if stats.TxFrames == 0 || stats.RxFrames == 0 {
		t.Errorf("card stats %+v: frames went neither way", stats)
	}
}
