package kvmhost

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"
)

// echoGuestEnv makes this test binary the echo guest of
// TestNetworkForwardsAndReachesHostLoopback; its value is the host's
// loopback TCP port to report to.
const echoGuestEnv = "KVMHOST_TEST_ECHO_GUEST"

// echoGuestPort is where the echo guest listens inside.
const echoGuestPort = 7000

// runEchoGuest runs inside the emulated host: it listens on
// GuestAddr:echoGuestPort, says so on stdout, echoes the first line of
// the first connection back, sends it to HostAddr:$echoGuestEnv too, and
// exits.
func runEchoGuest() int {
	ln, err := net.Listen("tcp", fmt.Sprintf("%s:%d", GuestAddr, echoGuestPort))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("echo guest listening")
	conn, err := ln.Accept()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer conn.Close()
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if _, err := io.WriteString(conn, line); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	up, err := net.Dial("tcp", HostAddr+":"+os.Getenv(echoGuestEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer up.Close()
	if _, err := io.WriteString(up, "from the guest: "+line); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// lineWriter delivers each line written to it on a channel.
type lineWriter struct {
	lines chan string
	buf   strings.Builder
}

func (w *lineWriter) Write(p []byte) (int, error) {
	for _, c := range p {
		if c != '\n' {
			w.buf.WriteByte(c)
			continue
		}
		select {
		case w.lines <- w.buf.String():
		default:
		}
		w.buf.Reset()
	}
	return len(p), nil
}

// TestNetworkForwardsAndReachesHostLoopback boots the emulated host with
// a network and a forward: a line sent to the forwarded host port comes
// back from the echo guest inside, which also reaches a listener on the
// host's loopback through HostAddr.
func TestNetworkForwardsAndReachesHostLoopback(t *testing.T) {
	needBoot(t)
	hostLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer hostLn.Close()
	fromGuest := make(chan string, 1)
	go func() {
		conn, err := hostLn.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		line, _ := bufio.NewReader(conn).ReadString('\n')
		fromGuest <- line
	}()
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fwdPort := free.Addr().(*net.TCPAddr).Port
	free.Close()

	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	stdout := &lineWriter{lines: make(chan string, 16)}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	type result struct {
		status int
		err    error
	}
	done := make(chan result, 1)
	go func() {
		status, err := Exec(ctx, Options{
			Binary: self, Args: []string{"-test.run=^$"},
			Env:     append(os.Environ(), fmt.Sprintf("%s=%d", echoGuestEnv, hostLn.Addr().(*net.TCPAddr).Port)),
			Stdout:  stdout,
			Network: &Network{Forwards: []Forward{{HostPort: fwdPort, GuestPort: echoGuestPort}}},
		})
		done <- result{status, err}
	}()
	select {
	case line := <-stdout.lines:
		if line != "echo guest listening" {
			t.Fatalf("echo guest said %q", line)
		}
	case r := <-done:
		t.Fatalf("emulated host ended before the echo guest listened: status %d, %v", r.status, r.err)
	}
	conn, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", fwdPort))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "ping through the forward\n"); err != nil {
		t.Fatal(err)
	}
	back, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil || back != "ping through the forward\n" {
		t.Fatalf("echo through the forward: %q, %v", back, err)
	}
	select {
	case line := <-fromGuest:
		if line != "from the guest: ping through the forward\n" {
			t.Fatalf("the host's listener got %q", line)
		}
	case <-ctx.Done():
		t.Fatal("the guest never reached the host's loopback")
	}
	if r := <-done; r.err != nil || r.status != 0 {
		t.Fatalf("echo guest: status %d, %v", r.status, r.err)
	}
}
