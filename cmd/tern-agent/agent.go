package main

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/spf13/cobra"

	"tern/agent"
	"tern/cmd/internal/serve"
	"tern/dataplane"
	"tern/instance/apiv1"
	"tern/internal/tlsconf"
	"tern/internal/units"
	"tern/migration"
)

func newAgentCmd() *cobra.Command {
	var listen, dataDir, certs, control, id string
	var underlay, pinDir, vxlanDevice string
	var apiTLS bool
	var cpus int
	memory := units.Bytes(4 << 30)
	cmd := &cobra.Command{
		Use:   "agent --listen ADDR --data-dir DIR --certs DIR [--control URL] [--cpus N --memory SIZE]",
		Short: "Run a host's agent: its vmm and downstairs processes, inventory and reports",
		Long: `Serve the host agent API on --listen: it spawns and supervises one
tern vmm serve per VM (a vmm that dies is reported, never restarted),
creates regions in --data-dir and runs their downstairs, reports
inventory (capacity, allocations, tern version, migration protocols) and,
with --control, registers there and relays every vmm snapshot. Vmms and
downstairs listen on --listen's IP. The first line on stdout is
"listening on URL".

With --dataplane IP (as root) the agent also runs the host's eBPF network
data plane with IP as its underlay address: a VXLAN device
(--dataplane-device), the programs' maps pinned under --dataplane-pin-dir
(default /sys/fs/bpf/tern-HOSTID, mounting a bpffs on /sys/fs/bpf if
none is there), every PUT /v1/v2p table applied to it, its counters on
GET /metrics.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := serve.Logger(logLevel, serve.ServerLogLevel)
			if err != nil {
				return err
			}
			if dataDir == "" || certs == "" {
				return errors.New("--data-dir and --certs are required")
			}
			if err := os.MkdirAll(dataDir, 0o755); err != nil {
				return fmt.Errorf("creating --data-dir: %w", err)
			}
			if id == "" {
				if id, err = persistentHostID(dataDir); err != nil {
					return err
				}
			}
			self, err := serve.TernBinary()
			if err != nil {
				return err
			}
			bundle, err := tlsconf.Load(certs)
			if err != nil {
				return fmt.Errorf("loading certificates: %w", err)
			}
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return fmt.Errorf("listening for the API: %w", err)
			}
			ip, _, _ := net.SplitHostPort(ln.Addr().String())
			scheme := "http"
			if apiTLS {
				scheme = "https"
			}
			url := fmt.Sprintf("%s://%s", scheme, ln.Addr())
			protos, err := serve.MigrationProtocols()
			if err != nil {
				return err
			}
			if protos == nil {
				protos = migration.SupportedVersions
			}
			if cpus <= 0 {
				cpus = runtime.NumCPU()
			}
			plane, underlayAddr, err := startDataPlane(underlay, pinDir, vxlanDevice, id, log)
			if err != nil {
				ln.Close()
				return err
			}
			closeAll := func() {}
			if plane != nil {
				closeAll = func() { plane.Close() }
			}
			a, err := agent.New(agent.Config{HostID: id, Plane: plane, Underlay: underlayAddr, Address: url, IP: ip, DataDir: dataDir, Certs: certs, Tern: self,
				CPUs: cpus, MemoryMiB: uint64(memory) >> 20,
				Version:     apiv1.Version{Build: serve.BuildVersion(), MigrationProtocols: protos, Devices: migration.DeviceVersions()},
				Control:     strings.TrimRight(control, "/"),
				ControlHTTP: serve.ClientHTTP(bundle, control),
				Logger:      log})
			if err != nil {
				closeAll()
				ln.Close()
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "listening on %s\n", url)
			log.Info("agent serving", "component", "agent", "url", url, "host", id)
			return serve.UntilDone(cmd.Context(), ln, a, bundle, apiTLS, func() { a.Close(); closeAll() })
		},
	}
	f := cmd.Flags()
	f.StringVar(&listen, "listen", "127.0.0.1:0", "address to serve the agent API on; its vmms and downstairs listen on its IP")
	f.StringVar(&dataDir, "data-dir", "", "directory of the host's regions and logs (required)")
	f.StringVar(&certs, "certs", "", "certificate directory (tern certs) for vmms, downstairs and --api-tls (required)")
	f.StringVar(&control, "control", "", "the control plane's URL to register with and report to")
	f.StringVar(&id, "id", "", "the host's id (default: one kept in --data-dir)")
	f.IntVar(&cpus, "cpus", 0, "vCPUs offered to vmms (default: the machine's CPUs)")
	f.Var(&memory, "memory", "guest memory offered to vmms")
	f.StringVar(&underlay, "dataplane", "", "run the eBPF network data plane (needs root) with this IPv4 as the host's underlay address")
	f.StringVar(&pinDir, "dataplane-pin-dir", "", "bpffs directory for the data plane's maps (default /sys/fs/bpf/tern-HOSTID)")
	f.StringVar(&vxlanDevice, "dataplane-device", dataplane.DefaultDevice, "name of the data plane's VXLAN device")
	f.BoolVar(&apiTLS, "api-tls", false, "serve the API over HTTPS, requiring client certificates from the --certs CA")
	return cmd
}

// persistentHostID returns the host id kept in dataDir, making one.
func persistentHostID(dataDir string) (string, error) {
	path := filepath.Join(dataDir, "host-id")
	if b, err := os.ReadFile(path); err == nil && len(strings.TrimSpace(string(b))) > 0 {
		return strings.TrimSpace(string(b)), nil
	}
	b := make([]byte, 4)
	rand.Read(b)
	id := "host-" + hex.EncodeToString(b)
	if err := os.WriteFile(path, []byte(id+"\n"), 0o644); err != nil {
		return "", fmt.Errorf("recording the host id: %w", err)
	}
	return id, nil
}

// startDataPlane starts the data plane --dataplane asks for (nil when it
// is not given).
func startDataPlane(underlay, pinDir, device, hostID string, log *slog.Logger) (*dataplane.Plane, netip.Addr, error) {
	if underlay == "" {
		return nil, netip.Addr{}, nil
	}
	addr, err := netip.ParseAddr(underlay)
	if err != nil || !addr.Is4() {
		return nil, netip.Addr{}, fmt.Errorf("--dataplane %q: want the host's underlay IPv4 address", underlay)
	}
	if os.Geteuid() != 0 {
		return nil, netip.Addr{}, errors.New("--dataplane needs root (it loads eBPF programs and creates devices)")
	}
	if pinDir == "" {
		if err := dataplane.MountBPFFS("/sys/fs/bpf"); err != nil {
			return nil, netip.Addr{}, err
		}
		pinDir = filepath.Join("/sys/fs/bpf", "tern-"+hostID)
	}
	p, err := dataplane.New(dataplane.Config{Underlay: addr, PinDir: pinDir, Device: device, Logger: log})
	if err != nil {
		return nil, netip.Addr{}, err
	}
	return p, addr, nil
}
