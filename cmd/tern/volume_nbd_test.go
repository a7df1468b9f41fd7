package main

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// nbdVolume is the size of the NBD tests' volumes: four 4 MiB extents.
const (
	nbdVolumeBytes = 16 << 20
	nbdExtentSize  = "4MiB"
)

// TestNBDInfoReportsSizeBlockSizesAndFlags asks nbdinfo about the export
// read-write, read-only, and over TLS from the certificate directory.
func TestNBDInfoReportsSizeBlockSizesAndFlags(t *testing.T) {
	needTools(t, "nbdinfo")
	v := startVolumeProcessesSized(t, nbdExtentSize)
	info := func(args ...string) map[string]any {
		t.Helper()
		var out struct {
			TLS     bool             `json:"TLS"`
			Exports []map[string]any `json:"exports"`
		}
		if err := json.Unmarshal([]byte(runTool(t, "nbdinfo", append([]string{"--json"}, args...)...)), &out); err != nil {
			t.Fatal(err)
		}
		if len(out.Exports) != 1 {
			t.Fatalf("nbdinfo lists %d exports", len(out.Exports))
		}
		out.Exports[0]["TLS"] = out.TLS
		return out.Exports[0]
	}
	check := func(got map[string]any, want map[string]any) {
		t.Helper()
		for k, w := range want {
			if got[k] != w {
				t.Errorf("nbdinfo %s = %v, want %v", k, got[k], w)
			}
		}
	}
	p := startNBD(t, v, 1)
	check(info(p.uri), map[string]any{
		"export-size": float64(nbdVolumeBytes), "block_size_minimum": float64(4096),
		"block_size_preferred": float64(4096), "block_size_maximum": float64(32 << 20),
		"can_flush": true, "can_fua": true, "can_multi_conn": true, "can_trim": true, "can_zero": true,
		"is_read_only": false, "TLS": false,
	})
	p.stop(t)

	p = startNBD(t, v, 2, "--read-only", "--export", "disk0")
	if !strings.HasSuffix(strings.SplitN(p.uri, "?", 2)[0], "/disk0") {
		t.Errorf("URI %s does not name the export", p.uri)
	}
	check(info(p.uri), map[string]any{"is_read_only": true, "can_flush": true, "can_multi_conn": true, "export-name": "disk0"})
	p.stop(t)

	// libnbd reads ca-cert.pem, client-cert.pem and client-key.pem, which
	// tern certs init links beside tern's own names: the directory as it is.
	p = startNBD(t, v, 3, "--tls", "--listen", "127.0.0.1:0")
	check(info(p.uri+"?tls-certificates="+v.certs), map[string]any{"TLS": true, "export-size": float64(nbdVolumeBytes)})
	plain := strings.Replace(p.uri, "nbds://", "nbd://", 1)
	if out, errOut, err := tryTool("nbdinfo", plain); err == nil {
		t.Errorf("nbdinfo without TLS got through: %s", out)
	} else {
		t.Logf("without TLS: %s", strings.TrimSpace(errOut))
	}
	p.stop(t)
}

func TestNBDListenBeyondLoopbackNeedsTLS(t *testing.T) {
	_, stderr, code := runTern(t, "volume", "nbd", "--targets", "127.0.0.1:1,127.0.0.1:2,127.0.0.1:3",
		"--certs", t.TempDir(), "--gen", "1", "--listen", "0.0.0.0:10809")
	oneLineError(t, stderr, code)
	if !strings.Contains(stderr, "--tls") || !strings.Contains(stderr, "loopback") {
		t.Errorf("refusal does not say why: %q", stderr)
	}
}

// TestNBDImagesInAndOut imports a random raw image with qemu-img convert,
// compares it, copies the export back out with nbdcopy, and imports a
// qcow2 image whose guest-visible bytes must read back.
func TestNBDImagesInAndOut(t *testing.T) {
	needTools(t, "qemu-img", "qemu-io", "nbdcopy")
	v := startVolumeProcessesSized(t, nbdExtentSize)
	p := startNBD(t, v, 1)
	dir := t.TempDir()
	raw := filepath.Join(dir, "random.raw")
	data := make([]byte, nbdVolumeBytes)
	rand.Read(data)
	if err := os.WriteFile(raw, data, 0o644); err != nil {
		t.Fatal(err)
	}
	runTool(t, "qemu-img", "convert", "-n", "-f", "raw", "-O", "raw", raw, p.uri)
	runTool(t, "qemu-img", "compare", "-f", "raw", "-F", "raw", raw, p.uri)
	out := filepath.Join(dir, "out.raw")
	runTool(t, "nbdcopy", p.uri, out)
	if got, err := os.ReadFile(out); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("nbdcopy's copy differs from the image imported (err %v)", err)
	}

	// A sparse qcow2: data in two places, the rest unallocated, which
	// qemu-img writes as zeroes over the random bytes now there.
	qcow := filepath.Join(dir, "guest.qcow2")
	runTool(t, "qemu-img", "create", "-q", "-f", "qcow2", qcow, fmt.Sprint(nbdVolumeBytes))
	runTool(t, "qemu-io", "-f", "qcow2", "-c", "write -P 0x5a 1M 3M", "-c", "write -P 0xc3 12M 64k", qcow)
	runTool(t, "qemu-img", "convert", "-n", "-f", "qcow2", "-O", "raw", qcow, p.uri)
	runTool(t, "qemu-img", "compare", "-f", "qcow2", "-F", "raw", qcow, p.uri)
	runTool(t, "nbdcopy", p.uri, out)
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	want := make([]byte, nbdVolumeBytes)
	copy(want[1<<20:4<<20], bytes.Repeat([]byte{0x5a}, 3<<20))
	copy(want[12<<20:12<<20+64<<10], bytes.Repeat([]byte{0xc3}, 64<<10))
	if !bytes.Equal(got, want) {
		t.Fatal("the qcow2 image's guest-visible bytes did not read back")
	}
	p.stop(t)
}

// fioJSON runs fio with args and returns its first job's result.
func fioJSON(t *testing.T, args ...string) (errors int, readBytes, writeBytes int64) {
	t.Helper()
	// No verify state file: fio would write it into the working
	// directory, which is the checkout.
	out := runTool(t, "fio", append([]string{"--output-format=json", "--verify_state_save=0"}, args...)...)
	// fio prints a line of its own before the JSON with the nbd engine.
	if i := strings.Index(out, "{"); i > 0 {
		out = out[i:]
	}
	var res struct {
		Jobs []struct {
			Error int `json:"error"`
			Read  struct {
				IOBytes int64 `json:"io_bytes"`
			} `json:"read"`
			Write struct {
				IOBytes int64 `json:"io_bytes"`
			} `json:"write"`
		} `json:"jobs"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil || len(res.Jobs) == 0 {
		t.Fatalf("fio output: %v: %s", err, out)
	}
	j := res.Jobs[0]
	return j.Error, j.Read.IOBytes, j.Write.IOBytes
}

// TestNBDFioVerifiesThroughADownstairsKill runs fio's nbd engine (random
// 4 KiB writes at queue depth 32, crc32c verified) and SIGKILLs a
// downstairs once IO flows; then a verify_only run reads it all back.
func TestNBDFioVerifiesThroughADownstairsKill(t *testing.T) {
	needTools(t, "fio")
	v := startVolumeProcessesSized(t, nbdExtentSize)
	p := startNBD(t, v, 1, "--stats", "200ms")
	job := []string{"--name=tern", "--ioengine=nbd", "--uri=" + p.uri, "--rw=randwrite", "--bs=4k",
		"--iodepth=32", fmt.Sprintf("--size=%d", nbdVolumeBytes), "--verify=crc32c"}
	type result struct {
		errors      int
		read, write int64
	}
	done := make(chan result, 1)
	go func() {
		var r result
		r.errors, r.read, r.write = fioJSON(t, append(job, "--loops=3")...)
		done <- r
	}()
	p.waitLine(t, "nbd: ") // a stats line: writes are flowing
	select {
	case <-done:
		t.Fatal("fio finished before the downstairs was killed")
	default:
	}
	v.kill(t, 2)
	t.Log("killed downstairs 2 mid-run")
	r := <-done
	if r.errors != 0 || r.write < 3*nbdVolumeBytes || r.read < 3*nbdVolumeBytes {
		t.Fatalf("fio: %d errors, wrote %d, verified %d bytes; want 0 errors and 3 × %d each\n%s", r.errors, r.write, r.read, nbdVolumeBytes, p.log())
	}
	errs, read, _ := fioJSON(t, append(job, "--verify_only")...)
	if errs != 0 || read < nbdVolumeBytes {
		t.Fatalf("fio --verify_only: %d errors, verified %d bytes", errs, read)
	}
	p.stop(t)
}

// TestNBDExt4ThroughNbdfuseAndALoopDevice makes a file system on the
// export (nbdfuse file, loop device with the export's block size), writes
// files, checks it with e2fsck, and reads the files back through a new
// `tern volume nbd` at a higher generation.
func TestNBDExt4ThroughNbdfuseAndALoopDevice(t *testing.T) {
	needTools(t, "nbdfuse", "fusermount3", "losetup", "mkfs.ext4", "e2fsck", "mount", "umount")
	if os.Geteuid() != 0 {
		t.Skip("needs root for losetup and mount")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skipf("no FUSE: %v", err)
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skipf("no loop devices: %v", err)
	}
	v := startVolumeProcessesSized(t, nbdExtentSize)
	dir := t.TempDir()
	fsDir := filepath.Join(dir, "fs")
	if err := os.Mkdir(fsDir, 0o755); err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{}
	for i, n := range []int{4096, 1 << 20, 3<<20 + 123} {
		b := make([]byte, n)
		rand.Read(b)
		files[fmt.Sprintf("file%d", i)] = b
	}

	p := startNBD(t, v, 1)
	dev := attachNBDLoop(t, p, filepath.Join(dir, "fuse1"))
	runTool(t, "mkfs.ext4", "-q", dev)
	runTool(t, "mount", dev, fsDir)
	sums := map[string]string{}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(fsDir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
		s := sha256.Sum256(b)
		sums[name] = hex.EncodeToString(s[:])
	}
	runTool(t, "umount", fsDir)
	if out, errOut, err := tryTool("e2fsck", "-fn", dev); err != nil {
		t.Fatalf("e2fsck -fn: %v\n%s%s", err, out, errOut)
	}
	detachNBDLoop(t, dev, filepath.Join(dir, "fuse1"))
	p.stop(t)

	p = startNBD(t, v, 2)
	dev = attachNBDLoop(t, p, filepath.Join(dir, "fuse2"))
	runTool(t, "mount", "-o", "ro", dev, fsDir)
	for name, want := range sums {
		b, err := os.ReadFile(filepath.Join(fsDir, name))
		if err != nil {
			t.Fatal(err)
		}
		if s := sha256.Sum256(b); hex.EncodeToString(s[:]) != want {
			t.Errorf("%s read back with a different checksum", name)
		}
	}
	runTool(t, "umount", fsDir)
	detachNBDLoop(t, dev, filepath.Join(dir, "fuse2"))
	p.stop(t)
}

// attachNBDLoop exposes the export as a file with nbdfuse and puts a loop
// device with 4 KiB sectors over it (libnbd refuses requests below the
// export's minimum block size, which mkfs on the bare file would send).
func attachNBDLoop(t *testing.T, p *nbdProc, mnt string) string {
	t.Helper()
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	pidFile := mnt + ".pid"
	fuse := exec.Command("nbdfuse", "-P", pidFile, filepath.Join(mnt, "disk"), p.uri)
	var fuseErr bytes.Buffer
	fuse.Stderr = &fuseErr
	if err := fuse.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- fuse.Wait() }()
	t.Cleanup(func() {
		exec.Command("fusermount3", "-u", mnt).Run()
		select {
		case <-exited:
		case <-time.After(nbdWait):
			fuse.Process.Kill()
		}
	})
	// nbdfuse writes its pid file once the file is being served.
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(nbdWait)
	for {
		if _, err := os.Stat(pidFile); err == nil {
			break
		}
		select {
		case err := <-exited:
			t.Fatalf("nbdfuse exited: %v: %s", err, fuseErr.String())
		case <-deadline:
			t.Fatalf("nbdfuse not ready within %v", nbdWait)
		case <-tick.C:
		}
	}
	dev := strings.TrimSpace(runTool(t, "losetup", "-b", "4096", "-f", "--show", filepath.Join(mnt, "disk")))
	t.Cleanup(func() { exec.Command("losetup", "-d", dev).Run() })
	return dev
}

func detachNBDLoop(t *testing.T, dev, mnt string) {
	t.Helper()
	runTool(t, "losetup", "-d", dev)
	runTool(t, "fusermount3", "-u", mnt)
}

// TestNBDBadInputLeavesOtherClientsAlone sends what a broken client would
// (an unknown export, a write past the end, garbage after the handshake, a
// request cut off by a close) while another connection keeps working.
func TestNBDBadInputLeavesOtherClientsAlone(t *testing.T) {
	needTools(t, "nbdinfo", "qemu-io")
	v := startVolumeProcessesSized(t, nbdExtentSize)
	p := startNBD(t, v, 1)
	block := bytes.Repeat([]byte{0x5a}, 4096)

	bystander := dialRawNBD(t, p.sock)
	if typ := bystander.optGo(""); typ != nbdRepAck {
		t.Fatalf("NBD_OPT_GO: reply %#x", typ)
	}
	bystander.request(nbdCmdWrite, 1, 0, 4096, block)
	if _, errno, _ := bystander.reply(0); errno != 0 {
		t.Fatalf("bystander's write: errno %d", errno)
	}

	unknown := dialRawNBD(t, p.sock)
	if typ := unknown.optGo("nope"); typ != nbdRepErrUnkn {
		t.Errorf("NBD_OPT_GO for an unknown export: reply %#x, want NBD_REP_ERR_UNKNOWN", typ)
	}
	if typ := unknown.optGo(""); typ != nbdRepAck {
		t.Errorf("NBD_OPT_GO for the default export after an unknown one: reply %#x", typ)
	}
	if _, errOut, err := tryTool("nbdinfo", strings.Replace(p.uri, ":///", ":///nope", 1)); err == nil {
		t.Error("nbdinfo opened an export that does not exist")
	} else {
		t.Logf("nbdinfo on an unknown export: %s", strings.TrimSpace(errOut))
	}

	pastEnd := dialRawNBD(t, p.sock)
	pastEnd.optGo("")
	pastEnd.request(nbdCmdWrite, 7, nbdVolumeBytes-4096, 8192, make([]byte, 8192))
	if cookie, errno, _ := pastEnd.reply(0); cookie != 7 || errno != nbdErrNoSpace {
		t.Errorf("write past the end: cookie %d errno %d, want 7 and ENOSPC", cookie, errno)
	}
	pastEnd.request(nbdCmdRead, 8, 0, 4096, nil)
	if _, errno, data := pastEnd.reply(4096); errno != 0 || !bytes.Equal(data, block) {
		t.Errorf("read after the refused write: errno %d", errno)
	}

	garbage := dialRawNBD(t, p.sock)
	garbage.optGo("")
	garbage.write(bytes.Repeat([]byte("not nbd "), 8))
	if !garbage.closedByServer() {
		t.Error("the server kept a connection that sent garbage")
	}
	p.waitLine(t, "disconnecting client")

	cut := dialRawNBD(t, p.sock)
	cut.optGo("")
	cut.request(nbdCmdWrite, 9, 8192, 8192, make([]byte, 100))
	cut.c.Close()

	bystander.request(nbdCmdRead, 2, 0, 4096, nil)
	if _, errno, data := bystander.reply(4096); errno != 0 || !bytes.Equal(data, block) {
		t.Fatalf("bystander's read after the bad clients: errno %d", errno)
	}
	bystander.request(nbdCmdFlush, 3, 0, 0, nil)
	if _, errno, _ := bystander.reply(0); errno != 0 {
		t.Fatalf("bystander's flush: errno %d", errno)
	}
	runTool(t, "qemu-io", "-f", "raw", "-r", "-c", "read -P 0x5a 0 4k", p.uri)
	p.stop(t)
}

// TestNBDFlushOnOneConnectionCoversAnother writes on one connection and
// leaves it open without flushing; a flush on a second connection must
// make that write durable (the replicas' extents clean again).
func TestNBDFlushOnOneConnectionCoversAnother(t *testing.T) {
	needTools(t, "qemu-io")
	v := startVolumeProcessesSized(t, nbdExtentSize)
	p := startNBD(t, v, 1)
	dirty := func() []int {
		t.Helper()
		out, errOut, code := runTern(t, "volume", "status", "--targets", v.targetList(), "--certs", v.certs, "--json")
		if code != 0 {
			t.Fatalf("volume status: %s", errOut)
		}
		var rep struct {
			Replicas []struct {
				DirtyExtents int `json:"dirty_extents"`
			} `json:"replicas"`
		}
		if err := json.Unmarshal([]byte(out), &rep); err != nil {
			t.Fatal(err)
		}
		var d []int
		for _, r := range rep.Replicas {
			d = append(d, r.DirtyExtents)
		}
		return d
	}
	writer := dialRawNBD(t, p.sock)
	writer.optGo("")
	// Extent 2; the flushing connection writes extent 0 only.
	writer.request(nbdCmdWrite, 1, 8<<20, 4096, bytes.Repeat([]byte{1}, 4096))
	if _, errno, _ := writer.reply(0); errno != 0 {
		t.Fatalf("write: errno %d", errno)
	}
	if d := dirty(); slices.Max(d) == 0 {
		t.Fatalf("no replica has a dirty extent after an unflushed write: %v", d)
	}
	runTool(t, "qemu-io", "-f", "raw", "-c", "write -P 2 0 4k", "-c", "flush", p.uri)
	clean := 0
	for _, n := range dirty() {
		if n == 0 {
			clean++
		}
	}
	if clean < 2 {
		t.Fatalf("a flush on another connection left the write unflushed on %d replicas", 3-clean)
	}
	writer.request(nbdCmdRead, 2, 8<<20, 4096, nil)
	if _, errno, data := writer.reply(4096); errno != 0 || data[0] != 1 {
		t.Fatalf("read back: errno %d", errno)
	}
	p.stop(t)
}

// TestNBDOverlappingWritesOnTwoConnectionsLeaveReplicasEqual runs two
// qemu-io processes writing overlapping ranges at once, then flushes on a
// third; every replica must then hold the same blocks.
func TestNBDOverlappingWritesOnTwoConnectionsLeaveReplicasEqual(t *testing.T) {
	needTools(t, "qemu-io")
	v := startVolumeProcessesSized(t, nbdExtentSize)
	p := startNBD(t, v, 1)
	writes := func(pattern int) []string {
		args := []string{"-f", "raw"}
		for i := range 64 {
			// 256 KiB writes every 64 KiB: each overlaps its neighbours
			// and the other process's.
			args = append(args, "-c", fmt.Sprintf("aio_write -P %d %d 256k", pattern+i%7, i*64<<10))
		}
		return append(args, "-c", "aio_flush", p.uri)
	}
	errs := make(chan error, 2)
	for _, pattern := range []int{0x10, 0x40} {
		go func() {
			_, errOut, err := tryTool("qemu-io", writes(pattern)...)
			if err != nil {
				err = fmt.Errorf("%v: %s", err, errOut)
			}
			errs <- err
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatalf("qemu-io: %v", err)
		}
	}
	runTool(t, "qemu-io", "-f", "raw", "-c", "write -P 0x99 15M 4k", "-c", "flush", p.uri)
	p.stop(t)
	for i := range v.running {
		v.stop(t, i)
	}
	want := regionHashes(t, v.dirs[0])
	for i, dir := range v.dirs[1:] {
		if got := regionHashes(t, dir); !slices.Equal(got, want) {
			t.Fatalf("replica %d holds different blocks from replica 0", i+1)
		}
	}
}

// TestNBDStopsWithinTenSecondsWithAClientAttached sends SIGINT while a
// client holds a connection open.
func TestNBDStopsWithinTenSecondsWithAClientAttached(t *testing.T) {
	v := startVolumeProcessesSized(t, nbdExtentSize)
	p := startNBD(t, v, 1)
	c := dialRawNBD(t, p.sock)
	c.optGo("")
	c.request(nbdCmdWrite, 1, 0, 4096, make([]byte, 4096))
	if _, errno, _ := c.reply(0); errno != 0 {
		t.Fatalf("write: errno %d", errno)
	}
	p.cmd.Process.Signal(syscall.SIGINT)
	select {
	case err := <-p.exited:
		if err != nil {
			t.Fatalf("exit after SIGINT: %v\n%s", err, p.log())
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("still running 10 s after SIGINT\n%s", p.log())
	}
	if !c.closedByServer() {
		t.Error("the client's connection stayed open")
	}
}
