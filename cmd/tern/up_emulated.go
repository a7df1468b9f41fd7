package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"tern/internal/kvmhost"
)

// upEmulatedHostAddr is the host's loopback as the vmm inside the
// emulated test host reaches it: the downstairs' targets there.
const upEmulatedHostAddr = kvmhost.HostAddr

// The vmm's API port inside the emulated test host, forwarded from a free
// port on the host's loopback.
const upEmulatedAPIPort = 12400

// upEmulatedStartWait bounds the emulated host's boot and the vmm's
// start in it (software emulation on a busy machine).
const upEmulatedStartWait = 5 * time.Minute

// upEmulatedMachineWait bounds the wait for another emulated host on this
// machine (kvmhost runs one at a time) before upEmulatedStartWait starts.
const upEmulatedMachineWait = 30 * time.Minute

// upEmulatedLifetime is the emulated host's time limit: tern up runs
// until it is stopped.
const upEmulatedLifetime = 100 * 365 * 24 * time.Hour

// emulatedVMM is `tern vmm serve` inside the emulated test host, whose
// QEMU is tern up's child.
type emulatedVMM struct {
	cancel context.CancelFunc
	exited chan struct{}
	// status and err are Exec's results, set before exited closes.
	status int
	err    error
}

// startEmulatedVMM boots the emulated test host running this tern's `vmm
// serve`, with its API forwarded to a free port of the host's loopback
// and the certificates and files (the guest's, at their host paths)
// carried in, and returns once the vmm printed its URL.
func startEmulatedVMM(ctx context.Context, self, certs string, guest upGuest, logPath string, out io.Writer) (vmmRunner, string, error) {
	hostPort, err := freeLoopbackTCPPort()
	if err != nil {
		return nil, "", err
	}
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, "", fmt.Errorf("opening vmm log: %w", err)
	}
	stdout, stdoutW := io.Pipe()
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	v := &emulatedVMM{cancel: cancel, exited: make(chan struct{})}
	onMachine := make(chan struct{})
	o := kvmhost.Options{
		Binary:  self,
		Args:    []string{"vmm", "serve", "--listen", fmt.Sprintf("%s:%d", kvmhost.GuestAddr, upEmulatedAPIPort), "--certs", certs},
		Files:   append([]kvmhost.File{{Host: certs}}, guest.files...),
		CPUs:    guest.emulatedCPUs,
		Timeout: upEmulatedLifetime,
		Stdout:  stdoutW,
		Stderr:  logFile,
		Log:     logFile,
		// A wait for another emulated host is said where the user sees it.
		WaitLog:   out,
		OnMachine: func() { close(onMachine) },
		Network:   &kvmhost.Network{Forwards: []kvmhost.Forward{{HostPort: hostPort, GuestPort: upEmulatedAPIPort}}},
	}
	go func() {
		v.status, v.err = kvmhost.Exec(ctx, o)
		stdoutW.Close()
		logFile.Close()
		close(v.exited)
	}()
	listening := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		if sc.Scan() && strings.HasPrefix(sc.Text(), "listening on ") {
			close(listening)
		}
		io.Copy(io.Discard, stdout)
	}()
	select {
	case <-onMachine:
	case <-v.exited:
		return nil, "", fmt.Errorf("starting vmm in the emulated test host: %s; see %s", v.describe(), logPath)
	case <-time.After(upEmulatedMachineWait):
		v.stop(0)
		return nil, "", fmt.Errorf("starting vmm in the emulated test host: another emulated host held this machine for over %v", upEmulatedMachineWait)
	}
	select {
	case <-listening:
		return v, fmt.Sprintf("http://127.0.0.1:%d", hostPort), nil
	case <-v.exited:
		return nil, "", fmt.Errorf("starting vmm in the emulated test host: %s; see %s", v.describe(), logPath)
	case <-time.After(upEmulatedStartWait):
		v.stop(0)
		return nil, "", fmt.Errorf("starting vmm in the emulated test host: no URL after %v; see %s", upEmulatedStartWait, logPath)
	}
}

func (v *emulatedVMM) done() <-chan struct{} { return v.exited }

// stop kills QEMU (kvmhost kills it by pid when its run is cancelled):
// the instance inside needs no clean stop, its volume's writes are
// flushed by the guest's own rounds.
func (v *emulatedVMM) stop(time.Duration) {
	v.cancel()
	<-v.exited
}

func (v *emulatedVMM) describe() string {
	if v.err != nil {
		return v.err.Error()
	}
	return fmt.Sprintf("tern vmm serve exited with status %d", v.status)
}

// freeLoopbackTCPPort returns a TCP port of 127.0.0.1 that was free a
// moment ago (QEMU binds forwards itself, so one cannot be handed over).
func freeLoopbackTCPPort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("finding a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
