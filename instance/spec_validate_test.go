package instance

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"tern/instance/apiv1"
	"tern/migration"
	"tern/vmm"
)

func validSpec() apiv1.Spec {
	return apiv1.Spec{ID: "i-1", VCPUs: 1, MemoryMiB: 64, Guest: apiv1.GuestSpec{Kind: apiv1.GuestELF, Path: "hello"}, Init: apiv1.InitSpec{Method: apiv1.InitSpecMethod}}
}

func TestValidateReportsEachProblem(t *testing.T) {
	file := filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(file, make([]byte, 4096), 0o644); err != nil {
		t.Fatal(err)
	}
	host := Host{MaxVCPUs: 2, VolumeTLS: true}
	wait := uint64(10)
	volume := apiv1.BackendSpec{Kind: apiv1.BackendVolume, Targets: []string{"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"},
		Region: &apiv1.RegionSpec{BlockSize: 512, ExtentBlocks: 8, ExtentCount: 2}, Gen: 1, QuorumWaitMs: &wait}
	for _, tc := range []struct {
		name   string
		mutate func(*apiv1.Spec)
		host   *Host
		want   []string // substrings, one problem each; none: valid
	}{
		{"valid built-in", func(*apiv1.Spec) {}, nil, nil},
		{"valid file disk", func(s *apiv1.Spec) {
			s.Guest.Path = "disk"
			s.Guest.Params = map[string]uint64{"seed": 1, "sectors": 8}
			s.Disks = []apiv1.DiskSpec{{Name: "d", Backend: apiv1.BackendSpec{Kind: apiv1.BackendFile, Path: file}}}
		}, nil, nil},
		{"valid volume disk", func(s *apiv1.Spec) { s.Disks = []apiv1.DiskSpec{{Name: "v", Backend: volume}} }, nil, nil},
		{"valid ec volume disk", func(s *apiv1.Spec) {
			b := volume
			b.Targets = []string{"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3", "127.0.0.1:4", "127.0.0.1:5", "127.0.0.1:6"}
			b.Layout = &apiv1.LayoutSpec{Kind: apiv1.LayoutEC, Data: 4, Parity: 2}
			s.Disks = []apiv1.DiskSpec{{Name: "v", Backend: b}}
		}, nil, nil},
		{"ec layout out of range", func(s *apiv1.Spec) {
			b := volume
			b.Layout = &apiv1.LayoutSpec{Kind: apiv1.LayoutEC, Data: 9, Parity: 4}
			s.Disks = []apiv1.DiskSpec{{Name: "v", Backend: b}}
		}, nil, []string{"disks[0].backend.layout: data 9, parity 4: want data from 2 to 8 and parity from 1 to 3"}},
		{"ec layout with three targets", func(s *apiv1.Spec) {
			b := volume
			b.Layout = &apiv1.LayoutSpec{Kind: apiv1.LayoutEC, Data: 4, Parity: 2}
			s.Disks = []apiv1.DiskSpec{{Name: "v", Backend: b}}
		}, nil, []string{"disks[0].backend.targets: 3 given; layout ec 4+2 wants 6 host:port addresses, one per shard"}},
		{"unknown layout", func(s *apiv1.Spec) {
			b := volume
			b.Layout = &apiv1.LayoutSpec{Kind: "raid6"}
			s.Disks = []apiv1.DiskSpec{{Name: "v", Backend: b}}
		}, nil, []string{`layout.kind "raid6": want "replicated" or "ec"`}},
		{"bad id", func(s *apiv1.Spec) { s.ID = "" }, nil, []string{"id"}},
		{"vcpus 0", func(s *apiv1.Spec) { s.VCPUs = 0 }, nil, []string{"vcpus: 0"}},
		{"vcpus beyond host", func(s *apiv1.Spec) { s.VCPUs = 3 }, nil, []string{"more than this host's KVM allows (2)"}},
		{"memory 0", func(s *apiv1.Spec) { s.MemoryMiB = 0 }, nil, []string{"memory_mib: 0"}},
		{"memory beyond host", func(s *apiv1.Spec) { s.MemoryMiB = 1 << 20 }, &Host{MemoryMiB: 1024}, []string{"host's RAM"}},
		{"no guest kind", func(s *apiv1.Spec) { s.Guest.Kind = "" }, nil, []string{"guest.kind: missing"}},
		{"valid linux", func(s *apiv1.Spec) {
			s.Guest = apiv1.GuestSpec{Kind: apiv1.GuestLinux, Kernel: file, Initrd: file, Cmdline: "console=ttyS0"}
		}, nil, nil},
		{"linux problems", func(s *apiv1.Spec) {
			s.Guest = apiv1.GuestSpec{Kind: apiv1.GuestLinux, Initrd: filepath.Dir(file), Path: "hello"}
			s.Disks = []apiv1.DiskSpec{{Name: "d", Backend: apiv1.BackendSpec{Kind: apiv1.BackendFile, Path: file}}}
		}, nil, []string{"path and params belong", "guest.kernel: missing", "guest.initrd"}},
		{"linux kernel not there", func(s *apiv1.Spec) {
			s.Guest = apiv1.GuestSpec{Kind: apiv1.GuestLinux, Kernel: "/no/such/vmlinuz", Initrd: "/no/such/initrd"}
		}, nil, []string{"guest.kernel \"/no/such/vmlinuz\": no such file", "guest.initrd \"/no/such/initrd\": no such file"}},
		{"elf with linux fields", func(s *apiv1.Spec) { s.Guest.Cmdline = "quiet" }, nil, []string{"belong to kind \"linux\""}},
		{"missing guest file", func(s *apiv1.Spec) { s.Guest.Path = "/no/such.elf" }, nil, []string{"no such file"}},
		{"params on a file", func(s *apiv1.Spec) { s.Guest.Path = file; s.Guest.Params = map[string]uint64{"seed": 1} }, nil,
			[]string{"only built-in guests"}},
		{"echo takes none", func(s *apiv1.Spec) { s.Guest.Path = "echo"; s.Guest.Params = map[string]uint64{"x": 1} }, nil, []string{"takes no parameters"}},
		{"hello takes hello_fault only", func(s *apiv1.Spec) { s.Guest.Params = map[string]uint64{"x": 1} }, nil, []string{"it takes hello_fault"}},
		{"dirty too big", func(s *apiv1.Spec) {
			s.Guest.Path = "dirty"
			s.Guest.Params = map[string]uint64{"mem_mib": 100, "working_set_mib": 200}
		}, nil, []string{"does not fit", "more than mem_mib"}},
		{"valid idle dirty", func(s *apiv1.Spec) {
			s.Guest.Path = "dirty"
			s.Guest.Params = map[string]uint64{"mem_mib": 16, "idle": 1, "dirty_mib_per_sec": 0, "verify_every_sec": 2}
		}, nil, nil},
		{"valid dirty, idle 0", func(s *apiv1.Spec) {
			s.Guest.Path = "dirty"
			s.Guest.Params = map[string]uint64{"idle": 0, "dirty_mib_per_sec": 10}
		}, nil, nil},
		{"dirty idle neither 0 nor 1", func(s *apiv1.Spec) {
			s.Guest.Path = "dirty"
			s.Guest.Params = map[string]uint64{"idle": 2}
		}, nil, []string{"guest.params.idle: 2"}},
		{"idle dirty with a rate", func(s *apiv1.Spec) {
			s.Guest.Path = "dirty"
			s.Guest.Params = map[string]uint64{"idle": 1, "dirty_mib_per_sec": 10}
		}, nil, []string{"an idle guest dirties nothing"}},
		{"disk guest without disk", func(s *apiv1.Spec) { s.Guest.Path = "disk" }, nil, []string{"needs a disk"}},
		{"duplicate disks", func(s *apiv1.Spec) {
			s.Disks = []apiv1.DiskSpec{{Name: "a", Backend: apiv1.BackendSpec{Kind: apiv1.BackendFile, Path: file}}, {Name: "a", Backend: apiv1.BackendSpec{Kind: apiv1.BackendFile, Path: file}}}
		}, nil, []string{"duplicate"}},
		{"valid two disks, the guest on the second", func(s *apiv1.Spec) {
			s.Guest.Path = "disk"
			s.Guest.Params = map[string]uint64{"device": 1}
			s.Disks = []apiv1.DiskSpec{{Name: "a", Backend: apiv1.BackendSpec{Kind: apiv1.BackendFile, Path: file}}, {Name: "b", Backend: volume}}
		}, nil, nil},
		{"disk guest device beyond the disks", func(s *apiv1.Spec) {
			s.Guest.Path = "disk"
			s.Guest.Params = map[string]uint64{"device": 2}
			s.Disks = []apiv1.DiskSpec{{Name: "a", Backend: apiv1.BackendSpec{Kind: apiv1.BackendFile, Path: file}}, {Name: "b", Backend: apiv1.BackendSpec{Kind: apiv1.BackendFile, Path: file}}}
		}, nil, []string{"guest.params.device: 2"}},
		{"too many disks", func(s *apiv1.Spec) {
			for i := range MaxDisks + 1 {
				s.Disks = append(s.Disks, apiv1.DiskSpec{Name: fmt.Sprintf("d%d", i), Backend: apiv1.BackendSpec{Kind: apiv1.BackendFile, Path: file}})
			}
		}, nil, []string{fmt.Sprintf("at most %d", MaxDisks)}},
		{"volume problems", func(s *apiv1.Spec) {
			v := volume
			v.Targets = []string{"nope", "nope"}
			v.Region = &apiv1.RegionSpec{BlockSize: 1000}
			v.Gen = 0
			v.Path = "x"
			s.Disks = []apiv1.DiskSpec{{Name: "v", Backend: v}}
		}, &Host{}, []string{"path: belongs", "--certs", "2 given", "missing port", "missing port", "duplicate", "block_size 1000", "extent_blocks", "gen"}},
		{"failure injector", func(s *apiv1.Spec) {
			s.Components = map[string]apiv1.ComponentSpec{"f": mustComponent(t, `{"kind":"migration_failure_injector","fail_imports":1,"phase":"device"}`)}
		}, nil, nil},
		{"bad failure injector", func(s *apiv1.Spec) {
			s.Components = map[string]apiv1.ComponentSpec{
				"a": mustComponent(t, `{"kind":"migration_failure_injector","fail_imports":-1,"phase":"device"}`),
				"b": mustComponent(t, `{"kind":"migration_failure_injector","phase":"teleport"}`),
				"c": mustComponent(t, `{"kind":"migration_failure_injector","phase":"sync","fail_at":1}`),
			}
		}, nil, []string{"components.a", "components.b", "components.c", "at most one"}},
		{"unknown component", func(s *apiv1.Spec) { s.Components = map[string]apiv1.ComponentSpec{"c": {Kind: "teapot"}} }, nil, []string{"unknown kind"}},
		{"unknown init", func(s *apiv1.Spec) { s.Init.Method = "clone" }, nil, []string{"unknown"}},
		{"migration fields on a spec", func(s *apiv1.Spec) { s.Init.Source = "127.0.0.1:1" }, nil, []string{"belong to method"}},
		{"valid migration target", func(s *apiv1.Spec) { *s = migrationTarget() }, nil, nil},
		{"valid migration target with disks and components", func(s *apiv1.Spec) {
			*s = migrationTarget()
			v := volume
			v.Gen = 0 // the source's + 1
			s.Disks = []apiv1.DiskSpec{{Name: "v", Backend: v}}
			s.Components = map[string]apiv1.ComponentSpec{"inj": mustComponent(t, `{"kind":"migration_failure_injector","fail_imports":1}`)}
		}, nil, nil},
		{"migration target names inherited fields", func(s *apiv1.Spec) {
			s.Init = migrationTarget().Init
			s.Name = "n"
			s.NICs = []apiv1.NICSpec{{TAP: "tap0"}}
		}, nil, []string{"name:", "vcpus:", "memory_mib:", "guest:", "nics: a migration target inherits"}},
		{"valid nics", func(s *apiv1.Spec) {
			s.NICs = []apiv1.NICSpec{{TAP: "tap0", MAC: "52:54:00:12:34:56"}, {TAP: "tap1"}}
		}, nil, nil},
		{"nic problems", func(s *apiv1.Spec) {
			s.NICs = []apiv1.NICSpec{{TAP: "", MAC: "zz"}, {TAP: "tap0", MAC: "01:00:5e:00:00:01"}, {TAP: "tap0", MAC: "00:00:00:00:00:00"},
				{TAP: "t3", MAC: "52:54:00:12:34:56"}, {TAP: "t4", MAC: "52-54-00-12-34-56"}}
		}, nil, []string{"nics: 5 given; this VMM attaches at most 4", "nics[0].tap: empty interface name", `nics[0].mac "zz": not a MAC address`,
			"nics[1].mac \"01:00:5e:00:00:01\": MAC 01:00:5e:00:00:01 is a multicast address", `nics[2].tap "tap0": duplicate of nics[1]`,
			"is all zero", "nics[4].mac 52:54:00:12:34:56: duplicate of nics[3]"}},
		{"migration target without source", func(s *apiv1.Spec) {
			*s = migrationTarget()
			s.Init.Source, s.Init.MigrationID = "", ""
			zero := uint64(0)
			s.Init.DowntimeTargetMs = &zero
		}, nil, []string{"init.source", "init.migration_id", "init.downtime_target_ms"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := validSpec()
			tc.mutate(&s)
			h := host
			if tc.host != nil {
				h = *tc.host
			}
			err := Validate(&s, h)
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidSpec) {
				t.Fatalf("Validate = %v; want ErrInvalidSpec", err)
			}
			problems := err.(interface{ Unwrap() []error }).Unwrap()
			if len(problems) != len(tc.want) {
				t.Fatalf("%d problems %v; want %d", len(problems), problems, len(tc.want))
			}
			for i, w := range tc.want {
				if !strings.Contains(problems[i].Error(), w) {
					t.Errorf("problem %d %q; want it to mention %q", i, problems[i], w)
				}
			}
		})
	}
}

func migrationTarget() apiv1.Spec {
	return apiv1.Spec{ID: "i-1", Init: apiv1.InitSpec{Method: apiv1.InitMigrationTarget, Source: "127.0.0.1:4000", MigrationID: "m-1"}}
}

func TestDecodeSpecIsStrictAndComponentsKeepTheirFields(t *testing.T) {
	for _, bad := range []string{`{"id":"a","bogus":1}`, `{"guest":{"kind":"elf","colour":1}}`, `{"id":"a"} {}`, `[`, `{"vcpus":"two"}`} {
		if _, err := apiv1.DecodeSpec([]byte(bad)); !errors.Is(err, apiv1.ErrMalformedSpec) {
			t.Errorf("DecodeSpec(%s) = %v; want ErrMalformedSpec", bad, err)
		}
	}
	s, err := apiv1.DecodeSpec([]byte(`{"id":"a","components":{"f":{"kind":"fault", "fail_at": "ram_push"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if c := s.Components["f"]; c.Kind != "fault" || string(c.Raw) != `{"kind":"fault","fail_at":"ram_push"}` {
		t.Fatalf("component %+v", c)
	}
	again, err := apiv1.DecodeSpec([]byte(`{"components":{"f":{"kind":"fault","fail_at":"ram_push"}},"id":"a"}`))
	if err != nil || !s.Equal(again) {
		t.Fatalf("the same spec reordered is not Equal: %v", err)
	}
	again.Name = "other"
	if s.Equal(again) {
		t.Fatal("specs with different names are Equal")
	}
}

func mustComponent(t *testing.T, js string) apiv1.ComponentSpec {
	t.Helper()
	var c apiv1.ComponentSpec
	if err := c.UnmarshalJSON([]byte(js)); err != nil {
		t.Fatal(err)
	}
	return c
}

func TestFailureInjectorIsParsedFromItsComponent(t *testing.T) {
	s := validSpec()
	if _, ok := failureInjector(s); ok {
		t.Fatal("a spec without the component has an injector")
	}
	s.Components = map[string]apiv1.ComponentSpec{"f": mustComponent(t, `{"kind":"migration_failure_injector","fail_exports":2,"phase":"ram_push"}`)}
	if err := Validate(&s, Host{}); err != nil {
		t.Fatal(err)
	}
	got, ok := failureInjector(s)
	if want := (migration.InjectorSpec{Phase: apiv1.PhaseRAMPush, FailExports: 2}); !ok || got != want {
		t.Fatalf("FailureInjector = %+v, %v; want %+v", got, ok, want)
	}
}

func TestNICsDecodeStrictlyAndReachTheVMWithTheirMACs(t *testing.T) {
	s, err := apiv1.DecodeSpec([]byte(`{"id":"i","vcpus":1,"memory_mib":64,"guest":{"kind":"elf","path":"hello"},"init":{"method":"spec"},
		"nics":[{"tap":"tap0","mac":"52:54:00:12:34:56"},{"tap":"tap1"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if err := Validate(&s, Host{}); err != nil {
		t.Fatal(err)
	}
	nics := vmmNICs(s)
	if len(nics) != 2 || nics[0].TAP != "tap0" || nics[0].MAC.String() != "52:54:00:12:34:56" ||
		nics[1].TAP != "tap1" || nics[1].MAC.String() != vmm.NICMAC("tap1").String() {
		t.Errorf("VM cards %+v", nics)
	}
	if _, err := apiv1.DecodeSpec([]byte(`{"id":"i","nics":[{"tap":"tap0","mtu":9000}]}`)); !errors.Is(err, apiv1.ErrMalformedSpec) {
		t.Errorf("an unknown field in a nic: %v; want ErrMalformedSpec", err)
	}
}
