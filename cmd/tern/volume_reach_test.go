package main

import (
	"bufio"
	"bytes"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// blackHole returns a loopback UDP address whose socket is open but never
// answers: a QUIC dial to it gets nothing back, like a wrong port.
func blackHole(t *testing.T) string {
	t.Helper()
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c.LocalAddr().String()
}

// stderrLines splits stderr into its non-empty lines.
func stderrLines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.TrimSpace(l) != "" {
			out = append(out, l)
		}
	}
	return out
}

func TestVolumeRejectsMalformedFlagsBeforeActivating(t *testing.T) {
	v := startVolumeProcesses(t)
	good := v.addrs
	tests := []struct {
		name    string
		targets string
		gen     string
		want    string
	}{
		{"no port", good[0] + ",localhost," + good[2], "1", `replica 1 "localhost": missing port in address`},
		{"port not a number", good[0] + "," + good[1] + ",127.0.0.1:http", "1", `replica 2 "127.0.0.1:http": port "http" is not a number`},
		{"two targets", good[0] + "," + good[1], "1", "want 3 addresses"},
		{"repeated target", good[0] + "," + good[0] + "," + good[2], "1", "repeats replica 0"},
		{"generation zero", v.targetList(), "0", "--gen 0: generations start at 1"},
	}
	for _, tt := range tests {
		_, errOut, code := runTern(t, "volume", "fill", "--targets", tt.targets, "--certs", v.certs, "--gen", tt.gen, "--length", "4KiB")
		if lines := stderrLines(errOut); code != 1 || len(lines) != 1 || !strings.Contains(lines[0], tt.want) {
			t.Errorf("%s: exited %d with %q, want exit 1 and one line naming %q", tt.name, code, errOut, tt.want)
		}
	}
	// None of them activated anything: generation 1 is still free.
	if _, errOut, code := runTern(t, "volume", "fill", "--targets", v.targetList(), "--certs", v.certs, "--gen", "1", "--length", "4KiB"); code != 0 {
		t.Fatalf("fill with generation 1 after the rejected ones exited %d: %s", code, errOut)
	}
}

// TestVolumeNamesTheReplicaItRunsWithout: one target that never answers
// (a wrong port) is named, with why, in one warning, and the fill goes on
// with two.
func TestVolumeNamesTheReplicaItRunsWithout(t *testing.T) {
	v := startVolumeProcesses(t)
	hole := blackHole(t)
	targets := v.addrs[0] + "," + v.addrs[1] + "," + hole
	_, errOut, code := runTern(t, "volume", "fill", "--targets", targets, "--certs", v.certs, "--gen", "1",
		"--length", "1MiB", "--activation-quorum-wait", "1s")
	if code != 0 {
		t.Fatalf("fill on two replicas exited %d: %s", code, errOut)
	}
	lines := stderrLines(errOut)
	want := "running on 2 of 3 replicas: replica 2 (" + hole + "): "
	if len(lines) != 1 || !strings.Contains(lines[0], `"level":"WARN"`) || !strings.Contains(lines[0], want) {
		t.Fatalf("stderr %q: want one WARN line with %q and a reason", errOut, want)
	}
	if reason := lines[0][strings.Index(lines[0], want)+len(want):]; len(strings.Trim(reason, `"}`)) == 0 {
		t.Fatalf("warning %q gives no reason", lines[0])
	}
}

// TestVolumeGivesUpAfterActivateTimeout: with two targets unreachable the
// command retries until --activate-timeout, then fails in one final line
// naming both, having warned at most once about each.
func TestVolumeGivesUpAfterActivateTimeout(t *testing.T) {
	v := startVolumeProcesses(t)
	holes := []string{blackHole(t), blackHole(t)}
	targets := v.addrs[0] + "," + holes[0] + "," + holes[1]
	for _, verb := range []string{"fill", "verify"} {
		_, errOut, code := runTern(t, "volume", verb, "--targets", targets, "--certs", v.certs, "--gen", "1",
			"--activation-quorum-wait", "1s", "--activate-timeout", "3s")
		lines := stderrLines(errOut)
		if code != 1 || len(lines) == 0 || len(lines) > 3 {
			t.Fatalf("%s exited %d with %q: want exit 1, a final line and at most one warning per replica", verb, code, errOut)
		}
		final := lines[len(lines)-1]
		for i, hole := range holes {
			if !strings.Contains(final, "replica "+string(rune('1'+i))+" ("+hole+"): ") {
				t.Errorf("%s: final line %q does not name replica %d (%s) and its error", verb, final, i+1, hole)
			}
		}
		if !strings.Contains(final, "--activate-timeout 3s") {
			t.Errorf("%s: final line %q does not say which limit ran out", verb, final)
		}
		for _, l := range lines[:len(lines)-1] {
			if !strings.Contains(l, `"level":"WARN"`) {
				t.Errorf("%s: unexpected stderr line %q", verb, l)
			}
		}
	}
}

// TestVolumeFailsOnAForeignCA: a certificate chain from another CA is not
// retried until the timeout; the command fails with the x509 reason.
func TestVolumeFailsOnAForeignCA(t *testing.T) {
	v := startVolumeProcesses(t)
	other := filepath.Join(t.TempDir(), "other-ca")
	if _, errOut, code := runTern(t, "certs", "init", "--dir", other); code != 0 {
		t.Fatalf("certs init: %s", errOut)
	}
	var stderr bytes.Buffer
	cmd := exec.Command(ternBin, "volume", "fill", "--targets", v.targetList(), "--certs", other, "--gen", "1",
		"--activate-timeout", "1h")
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		cmd.Process.Kill()
		<-done
		t.Fatalf("fill with a foreign CA still retrying after 2 minutes: %s", stderr.String())
	}
	lines := stderrLines(stderr.String())
	if cmd.ProcessState.ExitCode() != 1 || len(lines) != 1 || !strings.Contains(lines[0], "x509: ") {
		t.Fatalf("exited %d with %q: want exit 1 and one line with the x509 reason", cmd.ProcessState.ExitCode(), stderr.String())
	}
}

// TestVolumeFillGivesUpWhenTwoReplicasDie: two downstairs killed once the
// fill has activated leave it without a quorum; it gives up after
// --io-timeout naming them, and the replicas, once back, repair to one
// consistent volume.
func TestVolumeFillGivesUpWhenTwoReplicasDie(t *testing.T) {
	v := startVolumeProcessesSized(t, "64MiB") // 256 MiB: the fill outlasts the kills
	cmd := exec.Command(ternBin, "volume", "fill", "--targets", v.targetList(), "--certs", v.certs, "--gen", "1",
		"--seed", "3", "--io-timeout", "5s", "--log-level", "info")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var lines []string
	active := make(chan struct{})
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		sc := bufio.NewScanner(stderr)
		signalled := false
		for sc.Scan() {
			lines = append(lines, sc.Text())
			if !signalled && strings.Contains(sc.Text(), `"msg":"replica active"`) {
				close(active)
				signalled = true
			}
		}
	}()
	select {
	case <-active:
	case <-readDone:
		cmd.Wait()
		t.Fatalf("fill ended before activating: %s", strings.Join(lines, "\n"))
	case <-time.After(time.Minute):
		cmd.Process.Kill()
		t.Fatal("fill never activated")
	}
	v.kill(t, 1)
	v.kill(t, 2)
	select {
	case <-readDone:
	case <-time.After(3 * time.Minute):
		cmd.Process.Kill()
		<-readDone
		t.Fatalf("fill still running 3 minutes after losing two replicas")
	}
	cmd.Wait()
	if code := cmd.ProcessState.ExitCode(); code != 1 {
		t.Fatalf("fill exited %d after losing two replicas: %s", code, strings.Join(lines, "\n"))
	}
	final := lines[len(lines)-1]
	if !strings.Contains(final, "--io-timeout 5s") || !strings.Contains(final, "replica 1 ("+v.addrs[1]+")") ||
		!strings.Contains(final, "replica 2 ("+v.addrs[2]+")") || strings.Contains(final, v.addrs[0]) {
		t.Fatalf("final line %q: want the IO timeout and replicas 1 and 2, not replica 0", final)
	}
	v.start(t, 1)
	v.start(t, 2)
	common := []string{"--targets", v.targetList(), "--certs", v.certs}
	if _, errOut, code := runTern(t, append([]string{"volume", "repair", "--gen", "2"}, common...)...); code != 0 {
		t.Fatalf("repair after the lost fill exited %d: %s", code, errOut)
	}
	out, errOut, code := runTern(t, append([]string{"volume", "status", "--json"}, common...)...)
	if code != 0 || !strings.Contains(out, `"extents_disagreeing":0`) {
		t.Fatalf("status after repair exited %d: %s %s", code, out, errOut)
	}
}

// TestVolumeCommandsAreQuietByDefault: a client command prints its result
// and nothing on stderr; the downstairs logs the normal end of its
// sessions without an err field.
func TestVolumeCommandsAreQuietByDefault(t *testing.T) {
	v := startVolumeProcesses(t)
	common := []string{"--targets", v.targetList(), "--certs", v.certs}
	for _, args := range [][]string{
		{"volume", "fill", "--gen", "1", "--seed", "9"},
		{"volume", "verify", "--gen", "2", "--seed", "9"},
		{"volume", "repair", "--gen", "3"},
		{"volume", "status"},
	} {
		_, errOut, code := runTern(t, append(args, common...)...)
		if code != 0 {
			t.Fatalf("%v exited %d: %s", args, code, errOut)
		}
		if lines := stderrLines(errOut); args[1] != "repair" && len(lines) != 0 || args[1] == "repair" && len(lines) != 1 {
			t.Errorf("%v logged %q at the default level", args, errOut)
		}
	}
	// Each command but status opened a read-only probe session and an
	// activated one; status only a probe. Every one ended normally.
	for range 3*2 + 1 {
		rec := v.waitRecord(t, 0, func(rec map[string]any) bool { return rec["msg"] == "session ended" })
		if _, ok := rec["err"]; ok {
			t.Fatalf("a normal session end is logged with an error: %v", rec)
		}
	}
}

// TestVolumeWaitsForReplicasThatStartLate: until --activate-timeout the
// command keeps trying, so replicas that start after it warned are used.
func TestVolumeWaitsForReplicasThatStartLate(t *testing.T) {
	v := startVolumeProcesses(t)
	v.stop(t, 1)
	v.stop(t, 2)
	cmd := exec.Command(ternBin, "volume", "fill", "--targets", v.targetList(), "--certs", v.certs, "--gen", "1",
		"--length", "1MiB", "--activation-quorum-wait", "1s", "--activate-timeout", "10m")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	warned := make(chan struct{})
	readDone := make(chan struct{})
	var lines []string
	go func() {
		defer close(readDone)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			lines = append(lines, sc.Text())
			if len(lines) == 2 { // one warning for each missing replica
				close(warned)
			}
		}
	}()
	select {
	case <-warned:
	case <-readDone:
		cmd.Wait()
		t.Fatalf("fill ended without waiting: %q", lines)
	case <-time.After(2 * time.Minute):
		cmd.Process.Kill()
		<-readDone
		t.Fatal("fill gave no warning about two missing replicas within 2 minutes")
	}
	v.start(t, 1)
	v.start(t, 2)
	select {
	case <-readDone:
	case <-time.After(3 * time.Minute):
		cmd.Process.Kill()
		<-readDone
		t.Fatal("fill did not finish within 3 minutes of its replicas starting")
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("fill exited with %v once its replicas started: %q", err, lines)
	}
	if len(lines) != 2 || !strings.Contains(lines[0], "unreachable, retrying until --activate-timeout 10m0s") {
		t.Fatalf("stderr %q: want one retry warning per missing replica", lines)
	}
}
