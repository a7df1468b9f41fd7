package control

import (
	"strings"
	"testing"

	"tern/control/controlapi"
)

func TestPlanDrainIsFirstFitDecreasingAndNamesWhatCannotMove(t *testing.T) {
	hosts := []HostLoad{
		{ID: "a", Active: true, CPUs: 8, MemoryMiB: 1024, UsedMemory: 512},
		{ID: "b", Active: true, CPUs: 8, MemoryMiB: 1024, UsedMemory: 256},
		{ID: "c", Active: true, CPUs: 8, MemoryMiB: 1024},
	}
	items := []controlapi.DrainItem{{Name: "small", VCPUs: 1, MemoryMiB: 128}, {Name: "big", VCPUs: 1, MemoryMiB: 600}, {Name: "mid", VCPUs: 1, MemoryMiB: 400}}
	plan, err := PlanDrain(hosts, "c", items)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, p := range plan {
		got[p.Name] = p.Target
	}
	if plan[0].Name != "big" || got["big"] != "b" || got["mid"] != "a" || got["small"] != "b" {
		t.Fatalf("plan %+v", plan)
	}
	_, err = PlanDrain(hosts, "c", append(items, controlapi.DrainItem{Name: "huge", VCPUs: 1, MemoryMiB: 900}))
	if err == nil || !strings.Contains(err.Error(), "instance huge") {
		t.Fatalf("an impossible drain: %v; want it to name huge", err)
	}
}

func TestPlaceRegionsUsesThreeDifferentHosts(t *testing.T) {
	hosts := []HostLoad{{ID: "a", Active: true, RegionsCount: 2}, {ID: "b", Active: true}, {ID: "c", Active: true}, {ID: "d", Active: true, RegionsCount: 1}, {ID: "e"}}
	got, err := PlaceRegions(hosts)
	if err != nil || strings.Join(got, ",") != "b,c,d" {
		t.Fatalf("got %v, %v; want b,c,d", got, err)
	}
	if _, err := PlaceRegions(hosts[3:]); err == nil {
		t.Fatal("placed a volume on fewer than three hosts")
	}
}

func TestPlaceVMMPicksTheMostFreeMemoryThatFits(t *testing.T) {
	hosts := []HostLoad{{ID: "a", Active: true, CPUs: 2, MemoryMiB: 1024}, {ID: "b", Active: true, CPUs: 2, MemoryMiB: 2048, UsedCPUs: 2}, {ID: "c", Active: true, CPUs: 4, MemoryMiB: 512}}
	if got, _ := PlaceVMM(hosts, 1, 256, "", "x"); got != "a" {
		t.Fatalf("got %s, want a (b has no CPU left)", got)
	}
	if got, _ := PlaceVMM(hosts, 1, 256, "a", "x"); got != "c" {
		t.Fatalf("excluding a: got %s, want c", got)
	}
	if _, err := PlaceVMM(hosts, 1, 4096, "", "x"); err == nil {
		t.Fatal("placed what fits nowhere")
	}
}
