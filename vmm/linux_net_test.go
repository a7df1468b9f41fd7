package vmm_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"tern/vmm"
	"tern/vmm/kvm/kvmtest"
	"tern/vmm/linuxguest"
	"tern/vmm/linuxtest"
	"tern/vmm/tap/taptest"
)

// The link of TestTwoLinuxGuestsOnABridgePingEachOther: a TAP per guest,
// both on a bridge that has the host's address.
const (
	netTestBridge = "tern-lbr0"
	netTestHostIP = "10.77.0.1"
)

var (
	netTestTAPs     = [2]string{"tern-lt0", "tern-lt1"}
	netTestGuestIPs = [2]string{"10.77.0.2", "10.77.0.3"}
)

// TestTwoLinuxGuestsOnABridgePingEachOther boots tern's Linux userland
// twice at once, each VM with one network card on its own TAP, the two
// TAPs on one bridge that has the host's address: each guest finds its
// interface with the MAC tern gave it, pings the other guest and the
// host: ARP and ICMP both ways through each card's transmit and receive
// queues and interrupt, and through the host's bridge between the TAPs.
func TestTwoLinuxGuestsOnABridgePingEachOther(t *testing.T) {
	kvmtest.Require(t)
	u := linuxtest.Userland(t)
	if linuxtest.UnderNestedPVM() {
		linuxtest.RunInEmulatedHost(t)
		return
	}
	// Inside the emulated host the machine is the test's own; elsewhere
	// the TAPs, the bridge and its address go in a namespace of the
	// test's.
	var vms [2]*vmm.VM
	build := func() error {
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: netTestBridge}}
		if err := netlink.LinkAdd(br); err != nil {
			return fmt.Errorf("adding bridge %s: %w", netTestBridge, err)
		}
		for i, tap := range netTestTAPs {
			vm, err := vmm.New(vmm.Config{
				Linux:       &vmm.LinuxGuest{Kernel: u.Kernel, Initrd: u.Initrd, Cmdline: linuxguest.Cmdline},
				MemoryBytes: 256 << 20,
				NICs:        []vmm.NIC{{TAP: tap}},
			})
			if err != nil {
				return err
			}
			vms[i] = vm
			link, err := netlink.LinkByName(tap)
			if err != nil {
				return err
			}
			if err := netlink.LinkSetMaster(link, br); err != nil {
				return fmt.Errorf("putting %s on %s: %w", tap, netTestBridge, err)
			}
			if err := netlink.LinkSetUp(link); err != nil {
				return err
			}
		}
		addr, err := netlink.ParseAddr(netTestHostIP + "/24")
		if err != nil {
			return err
		}
		if err := netlink.AddrAdd(br, addr); err != nil {
			return err
		}
		return netlink.LinkSetUp(br)
	}
	var err error
	if kvmtest.Inside() {
		err = build()
		defer func() {
			if br, err := netlink.LinkByName(netTestBridge); err == nil {
				netlink.LinkDel(br)
			}
		}()
	} else {
		err = taptest.New(t).Do(build)
	}
	for _, vm := range vms {
		if vm != nil {
			t.Cleanup(func() { vm.Close() })
		}
	}
	if err != nil {
		t.Fatalf("building the VMs on %v and bridge %s: %v", netTestTAPs, netTestBridge, err)
	}
	var shells [2]*linuxtest.UARTShell
	var runs [2]*runWatch
	for i, vm := range vms {
		shells[i] = linuxtest.NewUARTShell(vm.Serial())
		defer shells[i].Close()
		runs[i] = watchRun(startWithin(t, vm, 2*linuxBoot()))
	}
	start := time.Now()
	for i, sh := range shells {
		sh.Limit = linuxBoot()
		// The wait ends when the guest's Run does: a guest that died
		// says how (its crash report), at once.
		ctx, cancel := context.WithCancel(t.Context())
		go func() {
			select {
			case <-runs[i].ended:
				cancel()
			case <-ctx.Done():
			}
		}()
		err := sh.WaitReady(ctx)
		cancel()
		if err != nil {
			select {
			case <-runs[i].ended:
				t.Fatalf("guest %d: %v; its Run ended: %d, %v", i, err, runs[i].r.status, runs[i].r.err)
			default:
				t.Fatalf("guest %d: %v", i, err)
			}
		}
		sh.Limit = kvmtest.Sized(generous, 4*time.Minute)
	}
	t.Logf("both ready after %.1fs", time.Since(start).Seconds())
	run := func(i int, cmd string) string {
		t.Helper()
		out, status, err := shells[i].Run(t.Context(), cmd)
		if err != nil {
			t.Fatalf("guest %d: %v", i, err)
		}
		if status != 0 {
			t.Fatalf("guest %d: %s: status %d, output:\n%s", i, cmd, status, out)
		}
		return out
	}
	for i := range vms {
		ifname := ""
		for _, name := range strings.Fields(run(i, "ls /sys/class/net")) {
			if name != "lo" {
				ifname = name
			}
		}
		if ifname == "" {
			t.Fatalf("guest %d has no network interface but lo", i)
		}
		if got, want := run(i, "cat /sys/class/net/"+ifname+"/address"), vmm.NICMAC(netTestTAPs[i]); got != want.String() {
			t.Errorf("guest %d: %s's MAC %q; want %v", i, ifname, got, want)
		}
		run(i, "ip addr add "+netTestGuestIPs[i]+"/24 dev "+ifname+" && ip link set "+ifname+" up")
	}
	for i := range vms {
		for _, to := range []string{netTestGuestIPs[1-i], netTestHostIP} {
			out := run(i, "ping -c 3 -W 10 "+to)
			if !strings.Contains(out, "3 packets received") {
				t.Errorf("guest %d: ping %s: %s; want 3 replies", i, to, out)
			}
		}
	}
	for i, sh := range shells {
		if err := sh.Type("exit 0"); err != nil {
			t.Fatal(err)
		}
		if r := runs[i].wait(t); r.err != nil || r.status != 0 {
			t.Fatalf("guest %d: Run = %d, %v; want 0; the console's last lines:\n%s", i, r.status, r.err, sh.Seen())
		}
		stats := vms[i].VirtioNets()[0].Stats()
		t.Logf("guest %d's card: %+v", i, stats)
		if stats.TxFrames == 0 || stats.RxFrames == 0 {
			t.Errorf("guest %d's card stats %+v: frames went neither way", i, stats)
		}
	}
}
