package agent

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"tern/agent/agentapi"
	"tern/dataplane"
	"tern/dataplane/nettest"
)

func TestPlaneTableUsesUnderlayThenAgentAddress(t *testing.T) {
	self := netip.MustParseAddr("10.99.0.1")
	got, err := planeTable([]agentapi.Mapping{
		{IP: "10.7.0.1", VNI: 7, InstanceID: "here", HostID: "a", HostAddress: "http://127.0.0.1:1"},
		{IP: "10.7.0.2", VNI: 7, InstanceID: "b1", HostID: "b", HostAddress: "http://10.0.0.2:7000", HostUnderlay: "10.99.0.2"},
		{IP: "10.7.0.3", VNI: 7, InstanceID: "c1", HostID: "c", HostAddress: "https://10.99.0.3:7000"},
	}, "a", self)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"10.99.0.1", "10.99.0.2", "10.99.0.3"}
	for i, m := range got {
		if m.Underlay.String() != want[i] {
			t.Errorf("mapping %s: underlay %v, want %s", m.InstanceID, m.Underlay, want[i])
		}
	}
	_, err = planeTable([]agentapi.Mapping{
		{IP: "fd00::1", VNI: 7, InstanceID: "v6", HostID: "a"},
		{IP: "10.7.0.2", VNI: 7, InstanceID: "named", HostID: "b", HostAddress: "http://host-b:7000"},
	}, "a", self)
	if err == nil || !strings.Contains(err.Error(), "not IPv4") || !strings.Contains(err.Error(), "no underlay") {
		t.Errorf("bad mappings: error %v, want both reported", err)
	}
}

// TestPutV2PProgramsTheDataPlane puts a table through the agent's API and
// reads it back from the kernel's map, and the counters from /metrics.
func TestPutV2PProgramsTheDataPlane(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: network namespaces and eBPF")
	}
	lab := nettest.NewLab()
	t.Cleanup(func() { lab.Close() })
	rack, err := nettest.NewRack(lab)
	if err != nil {
		t.Fatal(err)
	}
	host, err := rack.AddHost("a")
	if err != nil {
		t.Fatal(err)
	}
	vm, err := rack.AddVM(host, "vm", netip.MustParseAddr("10.7.0.1"), []byte{0x52, 0x54, 0, 0, 0, 1})
	if err != nil {
		t.Fatal(err)
	}
	fs := t.TempDir()
	if err := dataplane.MountBPFFS(fs); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(fs, unix.MNT_DETACH) })
	plane, err := dataplane.New(dataplane.Config{Underlay: host.Underlay, PinDir: filepath.Join(fs, "tern"), Netns: host.NS.Path()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { plane.Close() })
	if err := plane.AttachPort(dataplane.Port{InstanceID: "inst-1", Device: vm.Device, MAC: vm.MAC, VNI: 7, IP: vm.IP}); err != nil {
		t.Fatal(err)
	}
	a, err := New(Config{HostID: "host-a", Address: "http://127.0.0.1:1", DataDir: t.TempDir(), Plane: plane, Underlay: host.Underlay})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	srv := httptest.NewServer(a)
	t.Cleanup(srv.Close)

	put := func(ms []agentapi.Mapping) *http.Response {
		b, _ := json.Marshal(ms)
		req, _ := http.NewRequest(http.MethodPut, srv.URL+"/v1/v2p", bytes.NewReader(b))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	table := []agentapi.Mapping{
		{IP: "10.7.0.1", VNI: 7, InstanceID: "inst-1", HostID: "host-a", HostAddress: "http://127.0.0.1:1"},
		{IP: "10.7.0.2", VNI: 7, InstanceID: "inst-2", HostID: "host-b", HostAddress: "http://10.99.0.2:7000"},
	}
	if resp := put(table); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("PUT /v1/v2p: %s", resp.Status)
	}
	entries, err := plane.Entries()
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 2 || entries[0].Ifindex == 0 || entries[1].Ifindex != 0 || entries[1].Underlay.String() != "10.99.0.2" {
		t.Fatalf("kernel entries %+v: want inst-1 local and inst-2 on 10.99.0.2", entries)
	}
	// A mapping the plane cannot place is left out; the rest applies.
	moved := []agentapi.Mapping{table[0], {IP: "10.7.0.2", VNI: 7, InstanceID: "inst-2", HostID: "host-c", HostAddress: "http://10.99.0.3:7000"},
		{IP: "fd00::3", VNI: 7, InstanceID: "inst-3", HostID: "host-b"}}
	if resp := put(moved); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("PUT /v1/v2p with an IPv6 mapping: %s, want 204", resp.Status)
	}
	if after, _ := plane.Entries(); len(after) != 2 || after[1].Underlay.String() != "10.99.0.3" {
		t.Fatalf("entries %+v: want inst-2 moved to 10.99.0.3 and no IPv6 entry", after)
	}
	// A table the plane refuses whole (two VMs at one address) changes
	// nothing and is a 400.
	dup := append(moved[:2:2], agentapi.Mapping{IP: "10.7.0.2", VNI: 7, InstanceID: "inst-4", HostID: "host-b", HostAddress: "http://10.99.0.2:7000"})
	if resp := put(dup); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("PUT /v1/v2p with two VMs at one address: %s, want 400", resp.Status)
	}
	if after, _ := plane.Entries(); len(after) != 2 || after[1].Underlay.String() != "10.99.0.3" {
		t.Fatalf("a refused table changed the map: %+v", after)
	}
	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`tern_dataplane_packets_total{result="encapsulated"}`, `tern_dataplane_packets_total{result="drop_no_mapping"}`,
		"tern_dataplane_v2p_entries 2"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics has no %s:\n%s", want, body)
		}
	}
}
