package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"tern/internal/kvmhost"
	"tern/vmm/kvm"
	"tern/vmm/linuxguest"
)

// TestUpRefusesLinuxWithHostsAndUnknownGuests: --guest linux is for the
// single-host demo, and --guest takes demo or linux only; both fail
// before anything starts.
func TestUpRefusesLinuxWithHostsAndUnknownGuests(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--guest", "linux", "--hosts", "3"}, "--hosts runs the demo guest only"},
		{[]string{"--guest", "windows"}, `--guest "windows": want demo or linux`},
	} {
		_, stderr, code := runTern(t, append([]string{"up"}, tc.args...)...)
		if code == 0 || !strings.Contains(stderr, tc.want) {
			t.Errorf("tern up %v: exit %d, stderr %q; want a failure saying %q", tc.args, code, stderr, tc.want)
		}
	}
}

// TestUpGuestLinuxGivesAShellOnTheVolume runs `tern up --guest linux` as
// a user would: the Linux guest (built into the tests' shared cache, as
// the Linux boot tests build it) boots on the replicated volume, in the
// emulated test host where /dev/kvm cannot boot Linux, and prints its
// ready line and its prompt on tern up's output; a line typed over the
// serial websocket reaches its shell, which finds the volume's size on
// /dev/vda and makes an ext4 on it; SIGINT makes tern up exit 0 within
// 10 s with every child gone. One Linux boot.
func TestUpGuestLinuxGivesAShellOnTheVolume(t *testing.T) {
	if _, err := exec.LookPath("apt-get"); err != nil {
		t.Skipf("the Linux guest is built from Debian packages, so a Debian host is needed: %v", err)
	}
	probeErr := kvm.Probe()
	emulated, why, err := upVMMPlace(os.Getenv(upKVMHostEnv), probeErr, kvm.PVM(), true)
	if err != nil {
		t.Skipf("tern up --guest linux cannot run here: %v", err)
	}
	if emulated {
		if kvmhost.InsideEmulatedHost() {
			t.Skip("inside the emulated test host: another would emulate within emulation")
		}
		if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
			t.Skipf("%s, and qemu-system-x86_64 is not installed (apt-get install qemu-system-x86)", why)
		}
		t.Logf("the vmm runs in the emulated test host: %s", why)
	}
	var env []string
	if os.Getenv(linuxguest.CacheEnv) == "" {
		cache, err := kvmhost.CacheDir()
		if err != nil {
			t.Fatal(err)
		}
		env = append(env, linuxguest.CacheEnv+"="+filepath.Join(cache, "linuxguest"))
	}
	start := time.Now()
	// The URL comes after the guest's build (a first one fetches the
	// kernel's and the userland's packages) and the emulated host's boot.
	r := startUpWithin(t, env, 20*time.Minute, "--guest", "linux")
	t.Logf("API up and the instance running after %.1fs", time.Since(start).Seconds())

	// The console follows the intro, which names the ready line too.
	r.lines.next(t, "the end of the intro", time.After(time.Minute), func(l string) bool { return strings.HasPrefix(l, "Logs: ") })
	// A quiet boot in the emulated host takes 40-90 s alone, several
	// minutes with the rest of the suite on the same cores. Input typed
	// before the ready line may be lost (the kernel's serial driver
	// starts late); after it, the console's tty keeps it for the shell.
	boot := time.Now()
	_, ready := r.lines.nextOrEnd(t, "the Linux guest's ready line", time.After(15*time.Minute), func(l string) bool {
		if _, m, ok := strings.Cut(l, linuxguest.ModuleFailedPrefix); ok {
			t.Errorf("the Linux guest could not load module %s", strings.TrimSpace(m))
		}
		return strings.Contains(l, linuxguest.ReadyLine)
	})
	if !ready {
		// tern up ends when its instance fails; its stderr holds the
		// instance's error, with the crash report of a guest that
		// faulted. Never booted again: that may be tern's bug.
		err := <-r.exited
		t.Fatalf("tern up ended before the guest's ready line: %v; it printed:\n%s\nand on stderr:\n%s", err, strings.Join(r.lines.all, "\n"), r.stderr.String())
	}
	t.Logf("ready %.1fs after the instance ran", time.Since(boot).Seconds())

	ctx := t.Context()
	conn, err := r.client.Serial(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseNow()
	// The quotes keep the echo of the typed line from passing for the
	// output.
	const typed = `cat /sys/block/vda/size; mkfs.ext4 -q -F /dev/vda && echo "m""ade"`
	if err := conn.Write(ctx, websocket.MessageBinary, []byte(typed+"\n")); err != nil {
		t.Fatal(err)
	}
	sectors := strconv.Itoa(upExtentBlocks * upLinuxExtentCount)
	deadline := time.After(5 * time.Minute)
	prompted, sized := false, false
	r.lines.next(t, "the output of "+typed, deadline, func(l string) bool {
		l = strings.TrimRight(l, "\r")
		switch {
		case strings.HasPrefix(l, linuxguest.Prompt):
			prompted = true
		case l == sectors:
			sized = true
		}
		return l == "made"
	})
	if !prompted {
		t.Errorf("no line began with the prompt %q before the output", linuxguest.Prompt)
	}
	if !sized {
		t.Errorf("the shell printed no line %q (the volume's size in sectors) for /sys/block/vda/size", sectors)
	}
	conn.Close(websocket.StatusNormalClosure, "")
	t.Logf("the typed line's output after %.1fs", time.Since(boot).Seconds())

	r.stopCleanly(t, syscall.SIGINT, 4) // three downstairs and the vmm, or QEMU running it
}
