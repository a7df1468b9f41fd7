package dataplane

import (
	"net/netip"
	"strings"
	"testing"
	"time"
)

var (
	hostA = netip.MustParseAddr("10.99.0.1")
	hostB = netip.MustParseAddr("10.99.0.2")
	hostC = netip.MustParseAddr("10.99.0.3")
	vmIP  = netip.MustParseAddr("10.7.0.2")
)

func TestValidateTableReportsEveryProblem(t *testing.T) {
	err := validateTable([]Mapping{
		{VNI: 0, IP: vmIP, InstanceID: "a", Underlay: hostA},
		{VNI: 7, IP: netip.MustParseAddr("fd00::1"), InstanceID: "b", Underlay: hostA},
		{VNI: 7, IP: vmIP, InstanceID: "c", Underlay: netip.Addr{}},
		{VNI: 7, IP: vmIP, InstanceID: "d", Underlay: hostB},
		{VNI: 1 << 24, IP: netip.MustParseAddr("10.7.0.9"), Underlay: hostB},
	})
	if err == nil {
		t.Fatal("a table of bad mappings was accepted")
	}
	for _, want := range []string{"vni 0", "not IPv4", "underlay invalid IP is not IPv4", "is also c's", "vni 16777216", "no instance id"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if err := validateTable([]Mapping{{VNI: 7, IP: vmIP, InstanceID: "a", Underlay: hostA}, {VNI: 8, IP: vmIP, InstanceID: "b", Underlay: hostA}}); err != nil {
		t.Errorf("one address in two VNIs refused: %v", err)
	}
}

func TestDesiredEntriesNeedAMatchingPortForALocalVM(t *testing.T) {
	table := []Mapping{
		{VNI: 7, IP: vmIP, InstanceID: "here", Underlay: hostB},
		{VNI: 7, IP: netip.MustParseAddr("10.7.0.1"), InstanceID: "there", Underlay: hostA},
		{VNI: 7, IP: netip.MustParseAddr("10.7.0.3"), InstanceID: "unplugged", Underlay: hostB},
		{VNI: 7, IP: netip.MustParseAddr("10.7.0.4"), InstanceID: "othervni", Underlay: hostB},
	}
	ports := map[string]attachedPort{
		"here":     {Port: Port{VNI: 7, IP: vmIP}, ifindex: 12},
		"othervni": {Port: Port{VNI: 8, IP: netip.MustParseAddr("10.7.0.4")}, ifindex: 13},
	}
	got := desiredEntries(table, hostB, ports)
	if len(got) != 2 {
		t.Fatalf("entries %v: want the local VM with its port and the remote one", got)
	}
	if v := got[v2pV2pKey{Vni: 7, Ip: wireIP(vmIP)}]; v.Ifindex != 12 {
		t.Errorf("local entry %+v: want ifindex 12", v)
	}
	if v := got[v2pV2pKey{Vni: 7, Ip: wireIP(netip.MustParseAddr("10.7.0.1"))}]; v.Ifindex != 0 || addrFromHost(v.Host) != hostA {
		t.Errorf("remote entry %+v: want host %v", v, hostA)
	}
}

// TestPlanKeepsAForwardingEntryAfterAMove walks a VM moving from this host
// (B) to C, in both orders of the port going and the table changing, and
// checks the entry forwards until forwardFor after it left, then not.
func TestPlanKeepsAForwardingEntryAfterAMove(t *testing.T) {
	k := v2pV2pKey{Vni: 7, Ip: wireIP(vmIP)}
	local := map[v2pV2pKey]v2pV2pValue{k: {Host: hostIP(hostB), Ifindex: 5}}
	remote := map[v2pV2pKey]v2pV2pValue{k: {Host: hostIP(hostC)}}
	none := map[v2pV2pKey]v2pV2pValue{}
	t0 := time.Unix(1000, 0)
	const forwardFor = 10 * time.Second
	apply := func(kernel, prev, desired map[v2pV2pKey]v2pV2pValue, leftAt map[v2pV2pKey]time.Time, now time.Time) map[v2pV2pKey]v2pV2pValue {
		next := map[v2pV2pKey]v2pV2pValue{}
		for k, v := range kernel {
			next[k] = v
		}
		for _, u := range plan(prev, desired, kernel, leftAt, now, forwardFor) {
			if u.del {
				delete(next, u.key)
			} else {
				next[u.key] = u.val
			}
		}
		return next
	}
	for _, order := range []string{"table first", "port first"} {
		t.Run(order, func(t *testing.T) {
			leftAt := map[v2pV2pKey]time.Time{}
			kernel := apply(none, none, local, leftAt, t0)
			prev := local
			if order == "port first" {
				kernel = apply(kernel, prev, none, leftAt, t0.Add(time.Second))
				if _, ok := kernel[k]; ok {
					t.Fatalf("entry %v kept without a port", kernel[k])
				}
				prev = none
			}
			kernel = apply(kernel, prev, remote, leftAt, t0.Add(2*time.Second))
			if v := kernel[k]; v.Flags != v2pForward || addrFromHost(v.Host) != hostC {
				t.Fatalf("after the move the entry is %+v: want a forwarding entry to %v", v, hostC)
			}
			kernel = apply(kernel, remote, remote, leftAt, t0.Add(5*time.Second))
			if v := kernel[k]; v.Flags != v2pForward {
				t.Fatalf("a second push ended forwarding early: %+v", v)
			}
			if end, ok := nextDeadline(leftAt, forwardFor); !ok || end.After(t0.Add(12*time.Second)) {
				t.Fatalf("deadline %v, %v: want forwardFor after the VM left (at most 12 s after t0)", end, ok)
			}
			kernel = apply(kernel, remote, remote, leftAt, t0.Add(12*time.Second))
			if v := kernel[k]; v.Flags != 0 || addrFromHost(v.Host) != hostC {
				t.Fatalf("after forwardFor the entry is %+v: want a plain remote entry", v)
			}
			if _, ok := nextDeadline(leftAt, forwardFor); ok {
				t.Fatalf("a deadline is left: %v", leftAt)
			}
		})
	}
}

func TestPlanWritesBeforeItDeletesAndSkipsWhatIsUnchanged(t *testing.T) {
	a := v2pV2pKey{Vni: 7, Ip: 1}
	b := v2pV2pKey{Vni: 7, Ip: 2}
	c := v2pV2pKey{Vni: 7, Ip: 3}
	current := map[v2pV2pKey]v2pV2pValue{a: {Host: 1}, b: {Host: 1}}
	desired := map[v2pV2pKey]v2pV2pValue{a: {Host: 1}, c: {Host: 2}}
	got := plan(current, desired, current, map[v2pV2pKey]time.Time{}, time.Unix(0, 0), time.Minute)
	if len(got) != 2 || got[0].key != c || got[0].del || got[1].key != b || !got[1].del {
		t.Fatalf("plan %+v: want put c, then delete b", got)
	}
}
