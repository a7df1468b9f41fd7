package control

import (
	"fmt"
	"slices"
	"sort"

	"tern/control/controlapi"
)

// HostLoad is a host's capacity and what is reserved of it.
type HostLoad struct {
	ID           string
	Active       bool
	CPUs         int
	MemoryMiB    uint64
	UsedCPUs     int
	UsedMemory   uint64
	RegionsCount int
}

func (h HostLoad) fits(vcpus int, memMiB uint64) bool {
	return h.Active && h.UsedCPUs+vcpus <= h.CPUs && h.UsedMemory+memMiB <= h.MemoryMiB
}

// ErrNoCapacity is a request no host can take.
type ErrNoCapacity struct{ What string }

func (e *ErrNoCapacity) Error() string { return "no host has the capacity for " + e.What }

// PlaceVMM picks the active host, other than exclude, with the most free
// memory that fits vcpus and memMiB (ties by id).
func PlaceVMM(hosts []HostLoad, vcpus int, memMiB uint64, exclude string, what string) (string, error) {
	best := -1
	for i, h := range hosts {
		if h.ID == exclude || !h.fits(vcpus, memMiB) {
			continue
		}
		if best < 0 || h.MemoryMiB-h.UsedMemory > hosts[best].MemoryMiB-hosts[best].UsedMemory ||
			h.MemoryMiB-h.UsedMemory == hosts[best].MemoryMiB-hosts[best].UsedMemory && h.ID < hosts[best].ID {
			best = i
		}
	}
	if best < 0 {
		return "", &ErrNoCapacity{What: what}
	}
	return hosts[best].ID, nil
}

// PlaceRegions picks three different active hosts for a volume's regions,
// those with the fewest regions first (ties by id).
func PlaceRegions(hosts []HostLoad) ([]string, error) {
	var cand []HostLoad
	for _, h := range hosts {
		if h.Active {
			cand = append(cand, h)
		}
	}
	if len(cand) < 3 {
		return nil, fmt.Errorf("a volume needs three active hosts; there are %d", len(cand))
	}
	sort.Slice(cand, func(i, j int) bool {
		if cand[i].RegionsCount != cand[j].RegionsCount {
			return cand[i].RegionsCount < cand[j].RegionsCount
		}
		return cand[i].ID < cand[j].ID
	})
	return []string{cand[0].ID, cand[1].ID, cand[2].ID}, nil
}

// PlanDrain places every item off host by first-fit decreasing memory:
// the largest first, each on the first host (by id) with room, counting
// what the plan already put there. It fails naming the first instance
// that fits nowhere.
func PlanDrain(hosts []HostLoad, host string, items []controlapi.DrainItem) ([]controlapi.DrainItem, error) {
	loads := slices.Clone(hosts)
	sort.Slice(loads, func(i, j int) bool { return loads[i].ID < loads[j].ID })
	plan := slices.Clone(items)
	sort.SliceStable(plan, func(i, j int) bool {
		if plan[i].MemoryMiB != plan[j].MemoryMiB {
			return plan[i].MemoryMiB > plan[j].MemoryMiB
		}
		return plan[i].Name < plan[j].Name
	})
	for i := range plan {
		placed := false
		for j := range loads {
			if loads[j].ID == host || !loads[j].fits(plan[i].VCPUs, plan[i].MemoryMiB) {
				continue
			}
			loads[j].UsedCPUs += plan[i].VCPUs
			loads[j].UsedMemory += plan[i].MemoryMiB
			plan[i].Target = loads[j].ID
			placed = true
			break
		}
		if !placed {
			return nil, fmt.Errorf("cannot drain host %s: instance %s (%d vCPUs, %d MiB) fits on no other host", host, plan[i].Name, plan[i].VCPUs, plan[i].MemoryMiB)
		}
	}
	return plan, nil
}
