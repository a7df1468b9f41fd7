package multihost

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// ipCmd runs ip with args, failing t with its output.
func ipCmd(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// netnsHosts makes three network namespaces, each with a veth on one
// bridge of this namespace, and returns them as hosts with the
// bridge's own address for the control plane. Cleanup removes them.
func netnsHosts(t *testing.T) (controlIP string, hosts []hostSpec) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("network namespaces need root; the loopback-address variant runs without")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("no ip command (iproute2) to make network namespaces")
	}
	b := make([]byte, 3)
	rand.Read(b)
	tag := hex.EncodeToString(b)
	subnet := fmt.Sprintf("10.%d.%d", 200+int(b[0])%50, b[1])
	bridge := "tb" + tag
	ipCmd(t, "link", "add", bridge, "type", "bridge")
	t.Cleanup(func() { exec.Command("ip", "link", "del", bridge).Run() })
	ipCmd(t, "addr", "add", subnet+".1/24", "dev", bridge)
	ipCmd(t, "link", "set", bridge, "up")
	for i, id := range []string{"h2", "h3", "h4"} {
		ns := "tern-" + tag + "-" + id
		ipCmd(t, "netns", "add", ns)
		t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
		veth := "tv" + tag + id
		ipCmd(t, "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
		ipCmd(t, "link", "set", veth, "master", bridge, "up")
		ip := fmt.Sprintf("%s.%d", subnet, i+2)
		ipCmd(t, "-n", ns, "addr", "add", ip+"/24", "dev", "eth0")
		ipCmd(t, "-n", ns, "link", "set", "eth0", "up")
		ipCmd(t, "-n", ns, "link", "set", "lo", "up")
		hosts = append(hosts, hostSpec{id: id, ip: ip, ns: ns})
	}
	return subnet + ".1", hosts
}

// TestDrainInNetworkNamespaces is the drain test with each host's agent,
// vmms and downstairs in a network namespace of its own, reached over a
// bridge (as root; CI runs it).
func TestDrainInNetworkNamespaces(t *testing.T) {
	controlIP, hosts := netnsHosts(t)
	testDrain(t, newClusterWith(t, clusterOptions{controlIP: controlIP, hosts: hosts}))
}
