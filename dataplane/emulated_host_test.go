package dataplane_test

import (
	"context"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"tern/dataplane/planetest"
	"tern/internal/kvmhost"
)

// TestMain lets this test binary be the emulated test host's /init, for
// TestProgramsLoadAndAttachOnTheEmulatedHostsKernel.
func TestMain(m *testing.M) {
	if kvmhost.IsInit() {
		kvmhost.RunInit()
	}
	os.Exit(m.Run())
}

// emulatedHostTests run inside the emulated test host: two hosts' planes
// with traffic across them, and the VNI isolation with its forged packet.
var emulatedHostTests = []string{"TestUDPEchoAndPingAcrossHostsInOneVNI", "TestIsolationVNI8CannotReachVNI7"}

// TestProgramsLoadAndAttachOnTheEmulatedHostsKernel runs emulatedHostTests
// again in the emulated test host, on Debian's stable kernel (6.1, which
// has tc clsact but no TCX, and VXLAN, clsact and cls_bpf as the modules
// kvmhost loads), so the programs are proven to load, pass the verifier,
// attach by the tc-filter fallback and carry traffic on that kernel too,
// not only on the newer one the rest of the package runs on.
func TestProgramsLoadAndAttachOnTheEmulatedHostsKernel(t *testing.T) {
	planetest.NeedRoot(t)
	if kvmhost.InsideEmulatedHost() {
		t.Fatal("this test runs the others in the emulated host from outside it")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var out lockedBuilder // kvmhost writes the binary's stdout and stderr from two goroutines
	// The machine has one emulated host at a time: the wait for it (other
	// packages' Linux tests may hold it for many minutes) is bounded here,
	// within the package's 45 minutes; the boot and the tests by Timeout.
	ctx, cancel := context.WithTimeout(t.Context(), 40*time.Minute)
	defer cancel()
	st, err := kvmhost.Exec(ctx, kvmhost.Options{
		Binary: self,
		// The forwarding test's TCX case cannot pass on 6.1: only its
		// tc-filter case runs (the isolation test attaches with
		// AttachAuto, which falls back by itself).
		Args:       []string{"-test.run=^(" + strings.Join(emulatedHostTests, "|") + ")$/^tc-filter$", "-test.v", "-test.count=1", "-test.timeout=10m"},
		Timeout:    13 * time.Minute,
		RetryStall: true,
		Stdout:     &out,
		Stderr:     &out,
	})
	t.Logf("in the emulated host:\n%s", out.String())
	if err != nil || st != 0 {
		t.Fatalf("the data-plane tests in the emulated host: status %d, %v (their output is above)", st, err)
	}
	for _, name := range emulatedHostTests {
		if !strings.Contains(out.String(), "--- PASS: "+name+" ") {
			t.Errorf("%s did not pass in the emulated host", name)
		}
	}
	if !strings.Contains(out.String(), "no tcx on this kernel: attaching with a tc filter") {
		t.Errorf("the planes in the emulated host did not say they fell back to tc filters; its kernel has no TCX")
	}
}

// lockedBuilder is a strings.Builder safe for concurrent writers.
type lockedBuilder struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuilder) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuilder) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
