package client_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"tern/instance/apiv1"
	"tern/instance/client"
	"tern/vmm/guests"
	"tern/vmm/kvm/kvmtest"
	"tern/vmm/linuxtest"
)

// TestEveryDiskIsAttachedAndTheDiskGuestUsesTheOneItNames ensures an
// instance with two file disks and the disk guest pointed at the second
// (params.device 1): both are listed with their state, each answers on
// its own disk route, the guest passes, and only the second file holds
// its pattern.
func TestEveryDiskIsAttachedAndTheDiskGuestUsesTheOneItNames(t *testing.T) {
	p := startVMM(t, "")
	c, ctx := p.client, ctx(t)
	dir := t.TempDir()
	names := []string{"boot", "data"}
	var disks []apiv1.DiskSpec
	for _, n := range names {
		path := filepath.Join(dir, n+".img")
		if err := os.WriteFile(path, make([]byte, 256<<10), 0o644); err != nil {
			t.Fatal(err)
		}
		disks = append(disks, apiv1.DiskSpec{Name: n, Backend: apiv1.BackendSpec{Kind: apiv1.BackendFile, Path: path}})
	}
	const seed, sectors = 7, 32
	is := apiv1.Spec{ID: "two-disks", VCPUs: 1, MemoryMiB: 64,
		Guest: apiv1.GuestSpec{Kind: apiv1.GuestELF, Path: "disk", Params: map[string]uint64{"seed": seed, "sectors": sectors, "device": 1}},
		Disks: disks, Init: apiv1.InitSpec{Method: apiv1.InitSpecMethod}}
	v, err := c.Ensure(ctx, is)
	if err != nil {
		t.Fatalf("ensure: %v", err)
	}
	if len(v.Disks) != 2 || v.Disks[0].Name != "boot" || v.Disks[1].Name != "data" {
		t.Fatalf("ensure answered disks %+v; want boot and data", v.Disks)
	}
	for _, n := range names {
		d := waitDiskOpened(t, ctx, c, n)
		if d.Name != n || d.Kind != apiv1.BackendFile || d.State != apiv1.DiskReady || d.Activation != nil {
			t.Fatalf("disk %s: %+v; want a ready file disk without activation", n, d)
		}
	}
	if _, err := c.Disk(ctx, "nosuch"); err == nil {
		t.Fatal("GET /v1/instance/disks/nosuch answered")
	}
	if err := c.RequestState(ctx, apiv1.Run); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitFor(ctx, 0, func(s apiv1.View) bool { return s.State == apiv1.Destroyed }); err != nil {
		t.Fatalf("waiting for the guest to finish: %v", err)
	}
	h, err := c.SerialHistory(ctx, 0, 0)
	if want := fmt.Sprintf("disk: PASS %d sectors", sectors); err != nil || !strings.Contains(h.Data, want) {
		t.Fatalf("console %q, %v; want %q", h.Data, err, want)
	}
	v, err = c.Get(ctx)
	if err != nil || len(v.Disks) != 2 {
		t.Fatalf("after the guest: %+v, %v", v, err)
	}
	for i, d := range v.Disks {
		if d.Name != names[i] || d.State != apiv1.DiskClosed {
			t.Errorf("disk %d: %+v; want %s closed", i, d, names[i])
		}
		got, err := os.ReadFile(disks[i].Backend.Path)
		if err != nil {
			t.Fatal(err)
		}
		written := bytes.Equal(got[:512], guests.DiskPattern(seed, 0))
		if zero := bytes.Count(got, []byte{0}) == len(got); written != (i == 1) || !written && !zero {
			t.Errorf("disk %s: pattern written %v, all zero %v; want the pattern on data only", d.Name, written, zero)
		}
	}
}

// TestLinuxGuestBootsToInitThroughTheAPI ensures an instance of kind
// linux with Debian's kernel and the test initramfs and sees the init's
// line in the serial history. Its problems are answered synchronously,
// each listed. The guest's own reboot reboots the instance in place (a
// fresh VM, the same console, the init's line again) and its poweroff
// halts it with stop_reason "guest powered off". Under nested PVM it
// runs in the emulated test host.
func TestLinuxGuestBootsToInitThroughTheAPI(t *testing.T) {
	kvmtest.Require(t)
	g := linuxtest.Files(t)
	if linuxtest.UnderNestedPVM() {
		linuxtest.RunInEmulatedHost(t)
		return
	}
	p := startVMM(t, "")
	c, ctx := p.client, ctx(t)
	bad := apiv1.Spec{ID: "linux", VCPUs: 1, MemoryMiB: 512,
		Guest: apiv1.GuestSpec{Kind: apiv1.GuestLinux, Kernel: "/no/such/vmlinuz", Initrd: filepath.Dir(g.Initrd)},
		Init:  apiv1.InitSpec{Method: apiv1.InitSpecMethod}}
	_, err := c.Ensure(ctx, bad)
	e := wantCode(t, err, 400, apiv1.CodeInvalidSpec)
	if got := strings.Join(e.Body.Problems, "\n"); len(e.Body.Problems) != 2 || !strings.Contains(got, "guest.kernel") || !strings.Contains(got, "guest.initrd") {
		t.Fatalf("problems %q; want one about the kernel and one about the initrd", e.Body.Problems)
	}
	is := bad
	// quiet: this test is about the API, not the kernel's log (the vmm
	// package's tests read that); each console byte is an exit, slow in
	// the emulated host, and the shorter the boot the less of it runs
	// under a busy machine's timing.
	is.Guest = apiv1.GuestSpec{Kind: apiv1.GuestLinux, Kernel: g.BzImage, Initrd: g.Initrd, Cmdline: linuxtest.Cmdline + " quiet"}
	if v, err := c.Ensure(ctx, is); err != nil || v.State != apiv1.Creating {
		t.Fatalf("ensure: %+v, %v", v, err)
	}
	if err := c.RequestState(ctx, apiv1.Run); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitFor(ctx, 0, func(s apiv1.View) bool { return s.State == apiv1.Running }); err != nil {
		t.Fatal(err)
	}
	conn, err := c.Serial(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseNow()
	var console strings.Builder
	// readUntilN reads the console until want has been printed n times.
	readUntilN := func(want string, n int) {
		for strings.Count(console.String(), want) < n {
			_, msg, err := conn.Read(ctx)
			if err != nil {
				// The emulated host sometimes stops a Linux guest's
				// console for good (an interrupt the nested irqchip
				// never delivers, which the watchdog's re-raises do
				// not cure): kvmtest runs a test that says so once
				// more in a fresh emulated host.
				t.Fatalf("reading the console for %q (%d times) (%s): %v; it printed:\n%s", want, n, kvmtest.ConsoleStall, err, console.String())
			}
			console.Write(msg)
		}
	}
	readUntil := func(want string) { readUntilN(want, 1) }
	readUntil(linuxtest.InitLine)
	type_ := func(line string) {
		t.Helper()
		if err := conn.Write(ctx, websocket.MessageBinary, []byte(line+"\n")); err != nil {
			t.Fatal(err)
		}
		readUntil(linuxtest.EchoPrefix + line)
	}
	// The kernel resets the machine: the instance boots a fresh VM over
	// the same console, which prints the init's line a second time.
	running, err := c.Get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	type_("reboot")
	// Rebooting, then Running: two generations on (the monitor may skip
	// the first, showing the latest).
	if _, err := c.WaitFor(ctx, running.Gen, func(s apiv1.View) bool {
		return s.State == apiv1.Running && s.Gen >= running.Gen+2
	}); err != nil {
		t.Fatalf("waiting for the guest's reboot to show as rebooting then running: %v; the console:\n%s", err, console.String())
	}
	readUntilN(linuxtest.InitLine, 2)
	// Then it powers off: the instance halts, saying so.
	type_("poweroff")
	if _, err := c.WaitFor(ctx, 0, func(s apiv1.View) bool { return s.State == apiv1.Destroyed }); err != nil {
		t.Fatal(err)
	}
	h, err := c.SerialHistory(ctx, 0, 0)
	if err != nil || strings.Count(h.Data, linuxtest.InitLine) != 2 || !strings.Contains(h.Data, linuxtest.EchoPrefix+"poweroff") {
		t.Fatalf("serial history %+v, %v; want the init's line twice and the poweroff's echo", h, err)
	}
	if v, err := c.Get(ctx); err != nil || v.Error != "" || v.StopReason != "guest powered off" {
		t.Fatalf("after the guest powered off: %+v, %v; want destroyed without an error, stop reason %q", v, err, "guest powered off")
	}
}

// waitDiskOpened asks for disk name until it is no longer opening. The
// instance opens its disks on its own goroutine after the ensure answered,
// and publishes no generation for it while no run is requested, so this
// asks again, bounded by ctx and a minute.
func waitDiskOpened(t *testing.T, ctx context.Context, c *client.Client, name string) apiv1.DiskStatus {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		d, err := c.Disk(ctx, name)
		if err != nil {
			t.Fatalf("disk %s: %v", name, err)
		}
		if d.State != apiv1.DiskOpening {
			return d
		}
		if time.Now().After(deadline) {
			t.Fatalf("disk %s still opening after a minute: %+v", name, d)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
