package kvmhost

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// cpioEntry is one parsed newc entry.
type cpioEntry struct {
	name string
	mode uint32
	data string
}

// parseCPIO reads a newc archive back, checking the magic and alignment.
func parseCPIO(t *testing.T, b []byte) []cpioEntry {
	t.Helper()
	var out []cpioEntry
	for off := 0; ; {
		if off%4 != 0 || off+110 > len(b) || string(b[off:off+6]) != "070701" {
			t.Fatalf("bad header at %d", off)
		}
		field := func(i int) int {
			v, err := strconv.ParseUint(string(b[off+6+8*i:off+14+8*i]), 16, 32)
			if err != nil {
				t.Fatal(err)
			}
			return int(v)
		}
		mode, size, namesize := field(1), field(6), field(11)
		name := string(b[off+110 : off+110+namesize-1])
		off += 110 + namesize
		off = (off + 3) &^ 3
		if name == "TRAILER!!!" {
			if off != len(b) {
				t.Fatalf("%d bytes after the trailer", len(b)-off)
			}
			return out
		}
		out = append(out, cpioEntry{name, uint32(mode), string(b[off : off+size])})
		off = (off + size + 3) &^ 3
	}
}

func TestCPIOWriterAddsParentsOnceAndAligns(t *testing.T) {
	var buf bytes.Buffer
	w := newCPIOWriter(&buf)
	w.File("/a/b/file", 0o755, 5, strings.NewReader("hello"))
	w.File("/a/b/other", 0o644, 2, strings.NewReader("hi"))
	w.Symlink("/init", "/a/b/file")
	w.Dir("/a")
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	got := parseCPIO(t, buf.Bytes())
	want := []cpioEntry{
		{"a", cpioDir | 0o755, ""},
		{"a/b", cpioDir | 0o755, ""},
		{"a/b/file", cpioFile | 0o755, "hello"},
		{"a/b/other", cpioFile | 0o644, "hi"},
		{"init", cpioSymlink | 0o777, "/a/b/file"},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("entries = %+v\nwant %+v", got, want)
	}
}

func TestCPIOWriterReportsShortReader(t *testing.T) {
	w := newCPIOWriter(&bytes.Buffer{})
	w.File("/x", 0o644, 10, strings.NewReader("short"))
	if err := w.Close(); err == nil {
		t.Fatal("Close after a short file = nil, want an error")
	}
}

func TestDependenciesOfDynamicShell(t *testing.T) {
	deps, err := newLibResolver().Dependencies("/bin/sh")
	if err != nil {
		t.Fatal(err)
	}
	var haveLibc, haveInterp bool
	for _, d := range deps {
		haveLibc = haveLibc || filepath.Base(d) == "libc.so.6"
		haveInterp = haveInterp || strings.HasPrefix(filepath.Base(d), "ld-linux")
		if !filepath.IsAbs(d) || !isRegular(d) {
			t.Errorf("dependency %q is not an absolute path to a file", d)
		}
	}
	if !haveLibc || !haveInterp {
		t.Fatalf("/bin/sh dependencies = %v, want the dynamic loader and libc.so.6", deps)
	}
}

func TestDependenciesOfScriptAreItsInterpreters(t *testing.T) {
	p := filepath.Join(t.TempDir(), "script")
	if err := os.WriteFile(p, []byte("#!/bin/sh -e\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	deps, err := newLibResolver().Dependencies(p)
	if err != nil || len(deps) < 2 || deps[0] != "/bin/sh" {
		t.Fatalf("Dependencies(script) = %v, %v; want /bin/sh and its libraries", deps, err)
	}
	data := filepath.Join(t.TempDir(), "data")
	if err := os.WriteFile(data, []byte("plain bytes"), 0o644); err != nil {
		t.Fatal(err)
	}
	if deps, err := newLibResolver().Dependencies(data); err != nil || len(deps) != 0 {
		t.Fatalf("Dependencies(data) = %v, %v; want none", deps, err)
	}
}

// fakeBzImage builds the parts of a bzImage ExtractVmlinux reads: the
// setup header and a payload after the setup sectors.
func fakeBzImage(payload []byte) []byte {
	const setupSects = 2
	start := (setupSects + 1) * 512
	b := make([]byte, start+16+len(payload)+4)
	b[0x1f1] = setupSects
	binary.LittleEndian.PutUint32(b[0x202:], 0x53726448)
	binary.LittleEndian.PutUint32(b[0x248:], 16)
	binary.LittleEndian.PutUint32(b[0x24c:], uint32(len(payload)))
	copy(b[start+16:], payload)
	return b
}

func TestExtractVmlinuxGzipPayload(t *testing.T) {
	elf := []byte("\x7fELF fake kernel")
	var z bytes.Buffer
	zw := gzip.NewWriter(&z)
	zw.Write(elf)
	zw.Close()
	got, err := ExtractVmlinux(context.Background(), fakeBzImage(z.Bytes()))
	if err != nil || !bytes.Equal(got, elf) {
		t.Fatalf("ExtractVmlinux = %q, %v; want %q", got, err, elf)
	}
}

func TestExtractVmlinuxRejects(t *testing.T) {
	for name, img := range map[string][]byte{
		"not a bzImage":       make([]byte, 4096),
		"unknown compression": fakeBzImage([]byte("BZh91AY&SY")),
		"payload past end": func() []byte {
			b := fakeBzImage([]byte("x"))
			binary.LittleEndian.PutUint32(b[0x24c:], 1<<30)
			return b
		}(),
	} {
		if _, err := ExtractVmlinux(context.Background(), img); err == nil {
			t.Errorf("%s: ExtractVmlinux = nil error", name)
		}
	}
}

func TestParseFile(t *testing.T) {
	for _, c := range []struct {
		in   string
		want File
		bad  bool
	}{
		{in: "a.txt", want: File{Host: "a.txt"}},
		{in: "a.txt:/etc/a", want: File{Host: "a.txt", Guest: "/etc/a"}},
		{in: ":/etc/a", bad: true},
		{in: "a.txt:rel", bad: true},
	} {
		got, err := ParseFile(c.in)
		if (err != nil) != c.bad || got != c.want {
			t.Errorf("ParseFile(%q) = %+v, %v", c.in, got, err)
		}
	}
}

func TestGuestEnvSetsInsideAndTmp(t *testing.T) {
	got := guestEnv([]string{"A=1", "TMPDIR=/host/tmp", InsideEnv + "=0", "B=2"})
	want := []string{"A=1", "B=2", "TMPDIR=/tmp", InsideEnv + "=1"}
	if !slices.Equal(got, want) {
		t.Fatalf("guestEnv = %q, want %q", got, want)
	}
}

func TestHasCPUFlag(t *testing.T) {
	help := "x86 max\n\nRecognized CPUID flags:\n  fpu sse svm\n  vmx\n"
	if !hasCPUFlag(help, "svm") || hasCPUFlag(help, "sv") || hasCPUFlag("svm", "svm") {
		t.Fatal("hasCPUFlag misreads the flag list")
	}
}

func TestRefuseBenchmarkInsideEmulatedHost(t *testing.T) {
	if _, err := os.Stat(runSpecPath); err == nil {
		t.Skip("running inside the emulated host: cannot test the outside case")
	}
	t.Setenv(InsideEnv, "")
	if InsideEmulatedHost() || RefuseBenchmark() != nil {
		t.Fatal("outside the emulated host: refused")
	}
	t.Setenv(InsideEnv, "1")
	if !InsideEmulatedHost() {
		t.Fatal("InsideEmulatedHost = false with " + InsideEnv + "=1")
	}
	err := RefuseBenchmark()
	if !errors.Is(err, ErrBenchmarkInEmulatedHost) || !strings.HasPrefix(err.Error(), "refusing to report benchmark figures") {
		t.Fatalf("RefuseBenchmark = %v", err)
	}
}

func TestCheckResultString(t *testing.T) {
	for _, c := range []struct {
		r    CheckResult
		want string
	}{
		{CheckResult{"/dev/kvm", true, "ran to HLT"}, "/dev/kvm: yes (ran to HLT)"},
		{CheckResult{"emulated host", false, "no qemu"}, "emulated host: no: no qemu"},
	} {
		if got := fmt.Sprint(c.r); got != c.want {
			t.Errorf("%+v = %q, want %q", c.r, got, c.want)
		}
	}
}

func TestTimeoutFromEnvironment(t *testing.T) {
	for _, c := range []struct {
		env  string
		want time.Duration
		bad  bool
	}{
		{"", DefaultTimeout, false},
		{"90s", 90 * time.Second, false},
		{"soon", 0, true},
		{"-1m", 0, true},
	} {
		t.Setenv(TimeoutEnv, c.env)
		o := Options{Binary: "/bin/true"}
		err := o.defaults()
		if (err != nil) != c.bad || (!c.bad && o.Timeout != c.want) {
			t.Errorf("%s=%q: timeout %v, err %v", TimeoutEnv, c.env, o.Timeout, err)
		}
	}
	t.Setenv(TimeoutEnv, "90s")
	o := Options{Binary: "/bin/true", Timeout: time.Minute}
	if err := o.defaults(); err != nil || o.Timeout != time.Minute {
		t.Errorf("an explicit --timeout lost to the environment: %v, %v", o.Timeout, err)
	}
}

func TestCPIOWriterWritesCharDevNumbers(t *testing.T) {
	var buf bytes.Buffer
	w := newCPIOWriter(&buf)
	w.CharDev("/dev/console", 0o600, 5, 1)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	got := parseCPIO(t, buf.Bytes())
	want := []cpioEntry{{"dev", cpioDir | 0o755, ""}, {"dev/console", cpioCharDev | 0o600, ""}}
	if !slices.Equal(got, want) {
		t.Fatalf("entries = %+v\nwant %+v", got, want)
	}
	// c_rdevmajor and c_rdevminor are the 10th and 11th fields.
	hdr := buf.Bytes()[112:] // past "dev"'s 110-byte header and its padded name
	i := bytes.Index(hdr, []byte("070701"))
	if i < 0 {
		t.Fatal("no second header")
	}
	if maj, minor := string(hdr[i+6+8*9:i+6+8*10]), string(hdr[i+6+8*10:i+6+8*11]); maj != "00000005" || minor != "00000001" {
		t.Fatalf("rdev = %s:%s, want 00000005:00000001", maj, minor)
	}
}

func TestHostPathInFollowsLinksInsideTheRoot(t *testing.T) {
	root := t.TempDir()
	mk := func(rel string) {
		p := filepath.Join(root, rel)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(rel), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	link := func(rel, target string) {
		p := filepath.Join(root, rel)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.Symlink(target, p); err != nil {
			t.Fatal(err)
		}
	}
	mk("lib/x86_64-linux-gnu/ld-linux-x86-64.so.2")
	mk("etc/passwd")
	link("lib64/ld-linux-x86-64.so.2", "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2") // absolute: from the root
	link("sbin/mkfs.ext4", "mke2fs")                                                 // relative: beside it
	link("usr/lib/escape", "../../../../../etc/passwd")                              // ".." stops at the root
	link("loop", "loop")
	for _, c := range []struct{ guest, want string }{
		{"/lib64/ld-linux-x86-64.so.2", "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"},
		{"/sbin/mkfs.ext4", "/sbin/mke2fs"},
		{"/usr/lib/escape", "/etc/passwd"},
		{"/missing/file", "/missing/file"},
	} {
		got, err := HostPathIn(root, c.guest)
		if err != nil || got != filepath.Join(root, c.want) {
			t.Errorf("HostPathIn(%s) = %q, %v; want %q", c.guest, got, err, filepath.Join(root, c.want))
		}
	}
	if _, err := HostPathIn(root, "/loop"); err == nil || !strings.Contains(err.Error(), "too many symbolic links") {
		t.Errorf("HostPathIn(a link to itself) = %v, want too many symbolic links", err)
	}
}

// TestLibrariesInResolvesInsideTheRoot copies the host's /bin/sh and what
// it needs into a root laid out as Debian's packages unpack (the loader
// behind an absolute link), and resolves it there: the same guest paths,
// each naming a file inside the root; without libc it names what is
// missing.
func TestLibrariesInResolvesInsideTheRoot(t *testing.T) {
	hostDeps, err := newLibResolver().Dependencies("/bin/sh")
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	cp := func(host, guest string) {
		b, err := os.ReadFile(host)
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(root, guest)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	sh, _ := filepath.EvalSymlinks("/bin/sh")
	cp(sh, "/bin/sh")
	var libc string
	for _, d := range hostDeps {
		file, _ := filepath.EvalSymlinks(d)
		if strings.HasPrefix(filepath.Base(d), "ld-linux") {
			// Debian's libc6 ships the loader in the multiarch directory
			// and /lib64's name for it as an absolute link.
			cp(file, "/lib/x86_64-linux-gnu/"+filepath.Base(d))
			os.MkdirAll(filepath.Join(root, filepath.Dir(d)), 0o755)
			os.Symlink("/lib/x86_64-linux-gnu/"+filepath.Base(d), filepath.Join(root, d))
			continue
		}
		cp(file, "/lib/x86_64-linux-gnu/"+filepath.Base(d))
		if filepath.Base(d) == "libc.so.6" {
			libc = filepath.Join(root, "/lib/x86_64-linux-gnu/libc.so.6")
		}
	}
	got, err := LibrariesIn(root, "/bin/sh")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(hostDeps) {
		t.Fatalf("LibrariesIn = %v; the host resolved %v", got, hostDeps)
	}
	for _, g := range got {
		h, err := HostPathIn(root, g)
		if err != nil || !strings.HasPrefix(h, root+"/") || !isRegular(h) {
			t.Errorf("dependency %s is %q, %v: not a file inside the root", g, h, err)
		}
	}
	if libc == "" {
		t.Fatal("the host's /bin/sh needs no libc.so.6?")
	}
	os.Remove(libc)
	if _, err := LibrariesIn(root, "/bin/sh"); err == nil || !strings.Contains(err.Error(), "libc.so.6") || !strings.Contains(err.Error(), root) {
		t.Fatalf("LibrariesIn without libc = %v, want an error naming libc.so.6 and the root", err)
	}
}

// TestConsoleLogTracksTheHeartbeatApart: init's heartbeats date the
// machine's last sign of life and stay out of the tail kept for errors;
// before the first there is no silence to measure.
func TestConsoleLogTracksTheHeartbeatApart(t *testing.T) {
	c := newConsoleLog()
	if _, ok := c.silentFor(time.Now()); ok {
		t.Fatal("silence measured before any heartbeat")
	}
	before := time.Now()
	c.read(strings.NewReader("[    1.0] booting\n" + heartbeatPrefix + "1\r\n[    7.0] watchdog: BUG: soft lockup\n"))
	quiet, ok := c.silentFor(before.Add(time.Minute))
	if !ok || quiet > time.Minute || quiet < time.Minute-5*time.Second {
		t.Errorf("silentFor a minute after the beat = %v, %v; want about a minute, true", quiet, ok)
	}
	if tail := c.tail(); strings.Contains(tail, heartbeatPrefix) || !strings.Contains(tail, "soft lockup") || !strings.Contains(tail, "booting") {
		t.Errorf("tail = %q: want the kernel's lines without the heartbeat", tail)
	}
}

func TestEmulatedCPUsComeFromTheOptionsThenTheEnvironment(t *testing.T) {
	t.Setenv(CPUsEnv, "")
	if n, err := (&Options{}).emulatedCPUs(); err != nil || n != 1 {
		t.Errorf("default = %d, %v; want 1", n, err)
	}
	t.Setenv(CPUsEnv, "2")
	if n, err := (&Options{}).emulatedCPUs(); err != nil || n != 2 {
		t.Errorf("%s=2: %d, %v; want 2", CPUsEnv, n, err)
	}
	if n, err := (&Options{CPUs: 3}).emulatedCPUs(); err != nil || n != 3 {
		t.Errorf("CPUs 3 over %s=2: %d, %v; want 3", CPUsEnv, n, err)
	}
	for _, bad := range []string{"0", "5", "two"} {
		t.Setenv(CPUsEnv, bad)
		if _, err := (&Options{}).emulatedCPUs(); err == nil || !strings.Contains(err.Error(), CPUsEnv) {
			t.Errorf("%s=%q: %v, want an error naming it", CPUsEnv, bad, err)
		}
	}
	if _, err := (&Options{CPUs: 9}).emulatedCPUs(); err == nil {
		t.Error("CPUs 9 accepted")
	}
}

// TestQEMUVersionIsParsedFromItsBanner: the check names QEMU's version
// and knows 7.2 from 10.
func TestQEMUVersionIsParsedFromItsBanner(t *testing.T) {
	for _, c := range []struct {
		out     string
		major   int
		version string
		ok      bool
	}{
		{"QEMU emulator version 10.0.2 (Debian 1:10.0.2+ds-2+deb13u1~bpo12+1)\nCopyright (c) 2003-2025 Fabrice Bellard\n", 10, "10.0.2", true},
		{"QEMU emulator version 7.2.22 (Debian 1:7.2+dfsg-7+deb12u18+b3)\n", 7, "7.2.22", true},
		{"QEMU emulator version 9.1.0\n", 9, "9.1.0", true},
		{"qemu-system-x86_64: unknown option\n", 0, "", false},
		{"", 0, "", false},
	} {
		major, version, ok := qemuVersion(c.out)
		if major != c.major || version != c.version || ok != c.ok {
			t.Errorf("qemuVersion(%q) = %d, %q, %v; want %d, %q, %v", c.out, major, version, ok, c.major, c.version, c.ok)
		}
	}
}

// TestConsoleLogSeesAKernelPanic: a panic in the kept lines is told
// apart from a machine that merely stopped.
func TestConsoleLogSeesAKernelPanic(t *testing.T) {
	c := newConsoleLog()
	c.read(strings.NewReader("[    1.0] booting\n[  556.7] RIP: 0010:error_entry+0x10/0x130\n"))
	if c.panicked() {
		t.Fatal("panicked before any panic line")
	}
	c = newConsoleLog()
	c.read(strings.NewReader("[  556.7] RIP: 0010:error_entry+0x10/0x130\n[  556.739945] Kernel panic - not syncing: Fatal exception in interrupt\n"))
	if !c.panicked() {
		t.Fatal("the panic line was not seen")
	}
}

func TestOnlyTheEmulatedHostsOwnFailuresAreRetried(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("x: %w", ErrPanicked), true},
		{fmt.Errorf("x: %w", ErrHostExited), true},
		{fmt.Errorf("x: %w", ErrBootStalled), true},
		{fmt.Errorf("%w (%w)", fmt.Errorf("x: %w", ErrStalled), ErrLockedUp), true},
		{fmt.Errorf("x: %w", ErrStalled), false},
		{fmt.Errorf("x %w", ErrTimeout), false},
		{errors.New("the binary failed"), false},
		{nil, false},
	} {
		if got := hostFault(c.err); got != c.want {
			t.Errorf("hostFault(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

func TestTheConsoleTellsStartAndLockupApart(t *testing.T) {
	c := newConsoleLog()
	c.read(strings.NewReader("[    1.0] booting\nwatchdog: BUG: soft lockup - CPU#1 stuck for 22s! [qemu-system-x86:162]\n"))
	if c.started() {
		t.Error("started before init's start line")
	}
	if _, ok := c.silentFor(time.Now()); ok {
		t.Error("silentFor counts before init's start line")
	}
	if !c.lockedUp() {
		t.Error("the kernel's soft lockup line was not seen")
	}
	c = newConsoleLog()
	c.read(strings.NewReader(startedLine + "\r\n"))
	if !c.started() {
		t.Error("init's start line was not seen")
	}
	if c.lockedUp() || c.panicked() {
		t.Error("a lockup or a panic seen on a clean console")
	}
}
