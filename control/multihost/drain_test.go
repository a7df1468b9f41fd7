package multihost

import (
	"testing"

	"tern/control/controlapi"

	"tern/vmm/kvm/kvmtest"
)

// TestDrainMovesEveryInstanceAndItsGuestKeepsVerifying creates four
// dirty guests on volumes across three hosts on loopback addresses,
// drains one host, and checks every guest verifies on its new host, the
// drained host runs no vmm, and the records agree with the agents.
func TestDrainMovesEveryInstanceAndItsGuestKeepsVerifying(t *testing.T) {
	testDrain(t, newCluster(t))
}

func testDrain(t *testing.T, c *cluster) {
	// Four instances on three hosts, so the drained host has company to
	// place around; two inside the emulated test host, where each costs
	// minutes.
	names := kvmtest.Sized([]string{"d1", "d2", "d3", "d4"}, []string{"d1", "d2"})
	for _, n := range names {
		c.createDirty(n)
	}
	where := map[string]string{}
	for _, n := range names {
		h, url := c.waitRunning(n)
		where[n] = h
		waitVerifyPass(t, url, n+" before the drain")
	}
	drained := where["d1"]
	var d map[string]any
	c.mustCtl(&d, "host", "drain", drained)
	if d["state"] != "done" {
		t.Fatalf("drain ended %v", d)
	}
	if inv := c.inventory(drained); len(inv.VMMs) != 0 {
		t.Fatalf("the drained host %s still runs vmms %+v", drained, inv.VMMs)
	}
	var hosts []controlapi.HostView
	c.mustCtl(&hosts, "host", "list")
	for _, h := range hosts {
		if h.ID == drained && (h.State != controlapi.HostDrained || h.VMMs != 0) {
			t.Fatalf("the drained host's record: %+v", h)
		}
	}
	var list []controlapi.InstanceView
	c.mustCtl(&list, "instance", "list")
	for _, v := range list {
		running := c.runningVMMs(v.ID)
		if len(running) != 1 {
			t.Fatalf("instance %s runs %d vmms by the agents' reports: %+v", v.Name, len(running), running)
		}
		for h, s := range running {
			if v.State != "running" || v.Host != h || v.VMM != s.ID || h == drained {
				t.Fatalf("instance %s's record %+v disagrees with the agents (%s runs vmm %s) or is on the drained host", v.Name, v, h, s.ID)
			}
			waitVerifyPass(t, s.URL, v.Name+" after the drain")
		}
	}
	c.neverTwoRunning()
}
