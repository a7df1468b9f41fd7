package instance

import (
	"errors"
	"strings"
	"testing"

	"tern/instance/apiv1"
	"tern/volume/ids"
)

func TestMergeMigratedInheritsAllButDisksAndComponents(t *testing.T) {
	vol := func(gen ids.Generation, targets ...string) apiv1.BackendSpec {
		return apiv1.BackendSpec{Kind: apiv1.BackendVolume, Targets: targets, Region: &apiv1.RegionSpec{BlockSize: 512, ExtentBlocks: 8, ExtentCount: 2}, Gen: gen}
	}
	src := apiv1.Spec{ID: "i", Name: "n", VCPUs: 2, MemoryMiB: 64, Guest: apiv1.GuestSpec{Kind: apiv1.GuestELF, Path: "dirty"},
		Disks:      []apiv1.DiskSpec{{Name: "v", Backend: vol(4, "a:1", "b:1", "c:1")}},
		Components: map[string]apiv1.ComponentSpec{"inj": {Kind: ComponentMigrationFailureInjector}},
		Init:       apiv1.InitSpec{Method: apiv1.InitSpecMethod}}
	ensure := apiv1.Spec{ID: "i", Init: apiv1.InitSpec{Method: apiv1.InitMigrationTarget, Source: "s:1", MigrationID: "m"}}
	for _, tc := range []struct {
		name    string
		disks   []apiv1.DiskSpec
		wantGen ids.Generation
		wantErr string
	}{
		{"inherited volume at gen + 1", nil, 5, ""},
		{"replaced targets, gen omitted", []apiv1.DiskSpec{{Name: "v", Backend: vol(0, "d:1", "e:1", "f:1")}}, 5, ""},
		{"replaced with a higher gen", []apiv1.DiskSpec{{Name: "v", Backend: vol(9, "a:1", "b:1", "c:1")}}, 9, ""},
		{"gen not above the source's", []apiv1.DiskSpec{{Name: "v", Backend: vol(4, "a:1", "b:1", "c:1")}}, 0, "want more than the source's 4"},
		{"unknown disk", []apiv1.DiskSpec{{Name: "w", Backend: vol(0, "a:1", "b:1", "c:1")}}, 0, `no disk "w"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := ensure
			e.Disks = tc.disks
			got, err := mergeMigrated(e, src)
			if tc.wantErr != "" {
				if !errors.Is(err, ErrInvalidSpec) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("mergeMigrated = %v; want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.Name != "n" || got.VCPUs != 2 || got.MemoryMiB != 64 || got.Guest.Path != "dirty" || got.Init.Source != "s:1" || got.Components != nil {
				t.Fatalf("merged %+v; want the source's but init and components", got)
			}
			if got.Disks[0].Backend.Gen != tc.wantGen {
				t.Fatalf("gen %d; want %d", got.Disks[0].Backend.Gen, tc.wantGen)
			}
			if src.Disks[0].Backend.Gen != 4 {
				t.Fatal("the source's spec changed")
			}
		})
	}
	if _, err := mergeMigrated(apiv1.Spec{ID: "j"}, src); err == nil || !strings.Contains(err.Error(), `"i"`) {
		t.Fatalf("another id: %v", err)
	}
}
