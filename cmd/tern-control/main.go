// Command tern-control is the control plane: `tern control` runs it (the
// tern binary finds this one beside itself, on PATH, or builds it from its
// source tree). It is a binary of its own so that the etcd server and
// client it embeds, with gRPC and protobuf under them, are linked into the
// one process that uses them and not into every vmm, downstairs and CLI
// process on a host (docs/ARCHITECTURE.md, "Processes and binaries").
package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"tern/cmd/internal/serve"
	"tern/control"
	"tern/internal/tlsconf"
)

var logLevel string

func main() { serve.Main(newControlCmd(), "tern control") }

// controlCrashEnv, for fault-injection tests, makes tern control SIGKILL
// itself at a saga point ("before:STEP" or "after:STEP").
const controlCrashEnv = "TERN_CONTROL_CRASH_AT"

func newControlCmd() *cobra.Command {
	var listen, dataDir, certs, endpoints string
	var apiTLS bool
	var parallel int
	cmd := &cobra.Command{
		Use:   "tern-control --listen ADDR --data-dir DIR --certs DIR [--etcd-endpoints URLS]",
		Short: "Run the control plane: records in etcd, placement, migration sagas, drain",
		Long: `Serve the control-plane API on --listen. Records live in etcd: an
embedded single member in --data-dir by default, or the cluster at
--etcd-endpoints, which several control processes may share (one leads,
elected in etcd; the others forward writes to it). The leader resumes or
unwinds every saga in flight. The first line on stdout is
"listening on URL".`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := serve.Logger(logLevel, serve.ServerLogLevel)
			if err != nil {
				return err
			}
			if certs == "" || dataDir == "" && endpoints == "" {
				return errors.New("--certs and --data-dir (or --etcd-endpoints) are required")
			}
			bundle, err := tlsconf.Load(certs)
			if err != nil {
				return fmt.Errorf("loading certificates: %w", err)
			}
			var closeEtcd func()
			cfg := control.Config{Root: "/tern/", Logger: log, CrashAt: os.Getenv(controlCrashEnv), MaxParallelDrain: parallel}
			if endpoints != "" {
				cli, err := control.Connect(endpoints)
				if err != nil {
					return err
				}
				cfg.Etcd, closeEtcd = cli, func() { cli.Close() }
			} else {
				if err := os.MkdirAll(dataDir, 0o755); err != nil {
					return fmt.Errorf("creating --data-dir: %w", err)
				}
				e, err := control.StartEmbedded(dataDir)
				if err != nil {
					return err
				}
				cfg.Etcd, closeEtcd = e.Client, e.Close
			}
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				closeEtcd()
				return fmt.Errorf("listening for the API: %w", err)
			}
			scheme := "http"
			if apiTLS {
				scheme = "https"
			}
			cfg.URL = fmt.Sprintf("%s://%s", scheme, ln.Addr())
			cfg.AgentHTTP = serve.ClientHTTP(bundle, "")
			srv := control.NewServer(cfg)
			ctx := cmd.Context()
			runErr := make(chan error, 1)
			go func() { runErr <- srv.Run(ctx) }()
			fmt.Fprintf(cmd.OutOrStdout(), "listening on %s\n", cfg.URL)
			log.Info("control serving", "component", "control", "url", cfg.URL)
			return serve.UntilDone(ctx, ln, srv, bundle, apiTLS, func() {
				srv.Close()
				closeEtcd()
				if err := <-runErr; err != nil && !strings.Contains(err.Error(), "context canceled") {
					log.Warn("leadership ended", "err", err)
				}
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&logLevel, "log-level", "", "log level: debug, info, warn or error (default "+serve.ServerLogLevel+")")
	f.StringVar(&listen, "listen", serve.DefaultControlAddr, "address to serve the control API on")
	f.StringVar(&dataDir, "data-dir", "", "directory of the embedded etcd member")
	f.StringVar(&certs, "certs", "", "certificate directory (tern certs) for agents over TLS and --api-tls (required)")
	f.StringVar(&endpoints, "etcd-endpoints", "", "comma-separated URLs of an etcd cluster to keep the records in instead of the embedded member")
	f.BoolVar(&apiTLS, "api-tls", false, "serve the API over HTTPS, requiring client certificates from the --certs CA")
	f.IntVar(&parallel, "drain-parallel", 2, "how many migrations a drain runs at once (K)")
	return cmd
}
