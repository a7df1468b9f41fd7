package migration

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"tern/instance/apiv1"
	"tern/vmm"
	"tern/vmm/devices"
	"tern/vmm/guests"
	"tern/vmm/kvm/kvmtest"
	"tern/vmm/memory"
	"tern/volume/transport/transporttest"
)

func TestMain(m *testing.M) { kvmtest.Main(m) }

// generous bounds every wait; nothing asserts on time.
const generous = 2 * time.Minute

// testSpec is the instance spec the tests send: enough to rebuild the VM.
type testSpec struct {
	Guest       string    `json:"guest"`
	MemoryBytes uint64    `json:"memory_bytes"`
	VCPUs       int       `json:"vcpus"`
	NICs        []vmm.NIC `json:"nics,omitempty"`
	// TargetNetns names the network namespace the target opens its
	// TAPs in (the source's are in another: one TAP takes one VM).
	TargetNetns string `json:"target_netns,omitempty"`
}

func (s testSpec) config() vmm.Config {
	return vmm.Config{Guest: s.Guest, MemoryBytes: s.MemoryBytes, VCPUs: s.VCPUs, NICs: s.NICs}
}

// runningVM is a VM whose Run the test owns.
type runningVM struct {
	vm   *vmm.VM
	done chan error
}

func (r *runningVM) wait(t testing.TB) error {
	t.Helper()
	select {
	case err := <-r.done:
		r.done <- err
		return err
	case <-time.After(generous):
		t.Fatal("Run did not return")
		return nil
	}
}

// startVM runs vm; the cleanup stops and closes it.
func startVM(t testing.TB, vm *vmm.VM) *runningVM {
	r := &runningVM{vm: vm, done: make(chan error, 1)}
	go func() {
		_, err := vm.Run(context.Background())
		r.done <- err
	}()
	t.Cleanup(func() {
		vm.Stop()
		r.wait(t)
		if err := vm.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return r
}

// dirtySource boots the dirty guest on memBytes of RAM, rewriting a
// working set continuously, and waits for its first verification.
func dirtySource(t testing.TB, memBytes, workingSet uint64) (*runningVM, testSpec) {
	t.Helper()
	return dirtySourceWith(t, memBytes, workingSet, 1)
}

// The dirty guest inside the emulated test host, whatever size a test
// asks for: there a page crosses QUIC at well under 1 MiB/s (TCG runs the
// crypto and the race detector in software), and every test but the
// benchmark (which refuses to run there) checks a rule, not a rate. So
// 16 MiB of memory of which 1 MiB is patterned (what the first round
// sends: zero pages are skipped) and at most 128 KiB rewritten.
const (
	emulatedMemBytes     = 16 << 20
	emulatedPatternBytes = 1 << 20
	emulatedWorkingSet   = 128 << 10
)

// dirtySourceWith is dirtySource with vcpus vCPUs (the others park at HLT).
func dirtySourceWith(t testing.TB, memBytes, workingSet uint64, vcpus int) (*runningVM, testSpec) {
	t.Helper()
	pattern := memBytes - 8<<20
	if kvmtest.Inside() {
		memBytes, pattern, workingSet = emulatedMemBytes, emulatedPatternBytes, min(workingSet, emulatedWorkingSet)
	}
	spec := testSpec{Guest: "dirty", MemoryBytes: memBytes, VCPUs: vcpus}
	cfg := spec.config()
	cfg.Params = &guests.Params{
		MemStart: 4 << 20, MemBytes: pattern, WorkingSetBytes: workingSet,
		Passes: guests.PassesForever, VerifyEverySec: 1,
	}
	vm, err := vmm.New(cfg)
	if err != nil {
		t.Fatalf("vmm.New: %v", err)
	}
	r := startVM(t, vm)
	c := newConsole(vm.Serial().Output(), 0)
	c.waitVerifyPass(t)
	return r, spec
}

// console reads serial output line by line from an offset.
type console struct {
	h    *devices.History
	off  uint64
	part string
	seen []string
}

func newConsole(h *devices.History, from uint64) *console { return &console{h: h, off: from} }

// waitFor returns the first line match accepts.
func (c *console) waitFor(t testing.TB, what string, match func(string) bool) string {
	t.Helper()
	sub := c.h.Subscribe()
	defer sub.Close()
	deadline := time.After(generous)
	for {
		if i := strings.IndexByte(c.part, '\n'); i >= 0 {
			line := strings.TrimRight(c.part[:i], "\r")
			c.part = c.part[i+1:]
			c.seen = append(c.seen, line)
			if match(line) {
				return line
			}
			continue
		}
		data, _, next, err := c.h.ReadFrom(c.off, 1<<16)
		if err != nil {
			t.Fatalf("reading serial output: %v", err)
		}
		c.off = next
		if len(data) > 0 {
			c.part += string(data)
			continue
		}
		select {
		case <-sub.C():
		case <-deadline:
			t.Fatalf("no %s on the serial console; it printed %q", what, c.seen)
		}
	}
}

// waitVerifyPass waits for the next verification and fails on FAIL.
func (c *console) waitVerifyPass(t testing.TB) guests.DirtyVerify {
	t.Helper()
	line := c.waitFor(t, "dirty verification", func(l string) bool {
		_, ok := guests.ParseDirtyVerify(l)
		return ok
	})
	v, _ := guests.ParseDirtyVerify(line)
	if !v.Pass {
		t.Fatalf("dirty guest: %s", line)
	}
	return v
}

// requestVerify makes the dirty guest verify now.
func requestVerify(t testing.TB, vm *vmm.VM) {
	t.Helper()
	m := vm.Memory()
	n, err := m.Uint64(guests.ParamsAddr + guests.VerifyRequestOffset)
	if err == nil {
		err = m.PutUint64(guests.ParamsAddr+guests.VerifyRequestOffset, n+1)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// connPair returns the source's accepted and the target's dialed ends of
// a loopback QUIC connection with mutual TLS.
func connPair(t testing.TB) (src, dst *quic.Conn) {
	t.Helper()
	return transporttest.Pair(t, NextProto)
}

// migration is one run of Send against Receive.
type migration struct {
	src    SourceConfig
	dst    TargetConfig
	res    Result
	err    error
	dstVM  *vmm.VM
	dstRun *runningVM
	dstRes Result
	dstErr error
	srcLog []apiv1.Progress
	dstLog []apiv1.Progress
	// onSourceError runs inside the source's publication of phase error.
	onSourceError  func()
	sawSourceError bool
	// cancelAt cancels the migration's context when the source publishes
	// that phase.
	cancelAt apiv1.Phase
}

// targetConfig builds the target's VM from a testSpec and starts it in
// runs (owned by the test).
func targetConfig(t testing.TB, runs *[]*runningVM) TargetConfig {
	var mu sync.Mutex
	return TargetConfig{
		Build: func(b []byte, mem *memory.Memory) (*vmm.VM, error) {
			var s testSpec
			if err := json.Unmarshal(b, &s); err != nil {
				mem.Close()
				return nil, err
			}
			if s.TargetNetns != "" {
				return newTargetInNetns(s, mem)
			}
			return vmm.NewMigrationTarget(s.config(), mem)
		},
		Start: func(vm *vmm.VM) {
			r := &runningVM{vm: vm, done: make(chan error, 1)}
			go func() {
				_, err := vm.Run(context.Background())
				r.done <- err
			}()
			mu.Lock()
			*runs = append(*runs, r)
			mu.Unlock()
		},
	}
}

// migrate runs one migration over a fresh connection.
func (m *migration) run(t testing.TB) {
	t.Helper()
	src, dst := connPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), generous)
	defer cancel()
	// Each progress the source publishes is logged with its time, so a
	// slow or stalled migration shows where it spent it.
	start := time.Now()
	m.src.OnProgress = func(p apiv1.Progress) {
		t.Logf("%.2fs source %+v", time.Since(start).Seconds(), p)
		m.srcLog = append(m.srcLog, p)
		if m.cancelAt != 0 && p.Phase == m.cancelAt {
			cancel()
		}
		if p.Phase == apiv1.PhaseError {
			m.sawSourceError = true
			if m.onSourceError != nil {
				m.onSourceError()
			}
		}
	}
	var runs []*runningVM
	if m.dst.Build == nil {
		m.dst = mergeTarget(targetConfig(t, &runs), m.dst)
	}
	m.dst.OnProgress = func(p apiv1.Progress) { m.dstLog = append(m.dstLog, p) }
	var wg sync.WaitGroup
	wg.Go(func() { m.dstVM, m.dstRes, m.dstErr = Receive(ctx, dst, m.dst) })
	m.res, m.err = Send(ctx, src, m.src)
	wg.Wait()
	if len(runs) > 0 {
		m.dstRun = runs[0]
	}
	if m.dstVM != nil {
		vm, r := m.dstVM, m.dstRun
		t.Cleanup(func() {
			vm.Stop()
			r.wait(t)
			vm.Close()
		})
	}
}

func mergeTarget(base, over TargetConfig) TargetConfig {
	base.Versions, base.Injector, base.Logger = over.Versions, over.Injector, over.Logger
	return base
}

func lastPhase(log []apiv1.Progress) apiv1.Phase {
	if len(log) == 0 {
		return 0
	}
	return log[len(log)-1].Phase
}

func jsonMarshal(v any) ([]byte, error) { return json.Marshal(v) }
