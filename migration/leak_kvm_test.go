package migration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"tern/instance/apiv1"
	"tern/vmm/kvm/kvmtest"
)

// guestMemory counts this process's guest-memory memfds: open fds and
// mappings.
func guestMemory(t *testing.T) (fds, mappings int) {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if l, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err == nil && strings.Contains(l, "memfd:tern-ram") {
			fds++
		}
	}
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(maps), "\n") {
		if strings.Contains(l, "memfd:tern-ram") {
			mappings++
		}
	}
	return fds, mappings
}

func TestMigrationsLeaveNoGuestMemoryBehind(t *testing.T) {
	kvmtest.Require(t)
	fds, maps := guestMemory(t)
	for _, sameHost := range []bool{false, true} {
		t.Run(map[bool]string{false: "pages", true: "memfd"}[sameHost], func(t *testing.T) {
			a, spec := dirtySource(t, 64<<20, 1<<20)
			m := &migration{src: SourceConfig{VM: a.vm, Spec: mustJSON(t, spec)}}
			if sameHost {
				m.src.SameHostSocket = filepath.Join(t.TempDir(), "m.sock")
			}
			m.run(t)
			if m.err != nil || m.dstErr != nil {
				t.Fatalf("Send: %v; Receive: %v", m.err, m.dstErr)
			}
			// And one that fails after the target built its VM.
			a2, spec2 := dirtySource(t, 64<<20, 1<<20)
			m2 := &migration{src: SourceConfig{VM: a2.vm, Spec: mustJSON(t, spec2), Injector: NewInjector(InjectorSpec{Phase: apiv1.PhaseFinish, FailExports: 1})}}
			if sameHost {
				m2.src.SameHostSocket = filepath.Join(t.TempDir(), "m2.sock")
			}
			m2.run(t)
			if m2.err == nil {
				t.Fatal("the injected failure did not fail")
			}
		})
		if f, mp := guestMemory(t); f != fds || mp != maps {
			t.Errorf("after the %v migrations and closing every VM: %d memfds and %d mappings, before %d and %d", sameHost, f, mp, fds, maps)
		}
	}
}
