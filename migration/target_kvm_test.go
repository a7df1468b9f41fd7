package migration

import (
	"context"
	"errors"
	"sync"
	"testing"

	"tern/instance/apiv1"
	"tern/vmm"
	"tern/vmm/kvm/kvmtest"
	"tern/vmm/memory"
)

// TestTargetNeverRunsOnAnEarlyCommit plays a misbehaving source that
// commits after a partial memory copy, skipping the pause, the device
// state and the finish handshake: the target refuses and its VM never
// runs.
func TestTargetNeverRunsOnAnEarlyCommit(t *testing.T) {
	kvmtest.Require(t)
	for _, name := range []string{"after sync", "after one round", "in the device phase"} {
		t.Run(name, func(t *testing.T) {
			src, dst := connPair(t)
			var runs []*runningVM
			cfg := targetConfig(t, &runs)
			ctx, cancel := context.WithTimeout(context.Background(), generous)
			defer cancel()
			var (
				wg     sync.WaitGroup
				vm     *vmm.VM
				dstErr error
			)
			wg.Go(func() { vm, _, dstErr = Receive(ctx, dst, cfg) })
			p := &peer{conn: src}
			var err error
			if p.s, err = src.AcceptStream(ctx); err != nil {
				t.Fatal(err)
			}
			steps := []any{welcome{1}, preamble{Spec: mustJSON(t, testSpec{Guest: "dirty", MemoryBytes: 64 << 20, VCPUs: 1}),
				VCPUs: 1, Method: MethodPages, Regions: []memory.RegionSpec{{Name: "ram", Size: 64 << 20}}}}
			switch name {
			case "after one round":
				steps = append(steps, phaseMsg{apiv1.PhaseRAMPush}, pagesHeader{Region: 0, First: 0, Count: 1})
			case "in the device phase":
				steps = append(steps, phaseMsg{apiv1.PhaseRAMPush}, phaseMsg{apiv1.PhasePause}, phaseMsg{apiv1.PhaseRAMPushDirty}, phaseMsg{apiv1.PhaseDevice})
			}
			if _, err := expect[hello](p); err != nil {
				t.Fatal(err)
			}
			for _, m := range steps {
				if err := p.send(m); err != nil {
					t.Fatal(err)
				}
				if _, ok := m.(preamble); ok {
					if err := expectEmpty(p, msgReady); err != nil {
						t.Fatal(err)
					}
				}
				if _, ok := m.(pagesHeader); ok {
					p.s.Write(make([]byte, memory.PageSize))
				}
			}
			p.send(empty{msgCommit})
			wg.Wait()
			if vm != nil || !errors.Is(dstErr, ErrMalformed) {
				t.Fatalf("Receive = %v, %v; want no VM and ErrMalformed", vm, dstErr)
			}
			if len(runs) != 1 {
				t.Fatalf("%d target VMs started", len(runs))
			}
			if err := runs[0].wait(t); !errors.Is(err, vmm.ErrStopped) {
				t.Fatalf("the target's Run = %v, want ErrStopped", err)
			}
			if _, end := runs[0].vm.Serial().Output().Bounds(); end != 0 {
				t.Fatalf("the target's guest printed %d bytes", end)
			}
		})
	}
}
