package main

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/spf13/cobra"

	"tern/cmd/internal/serve"
	"tern/instance"
	"tern/instance/api"
	"tern/internal/tlsconf"
	"tern/migration"
	"tern/volume/transport"
)

func init() { vmmParentCmd().AddCommand(newVMMServeCmd()) }

// vmmParentCmd returns the `tern vmm` command, creating it if no other
// file did.
func vmmParentCmd() *cobra.Command {
	for _, c := range rootCmd.Commands() {
		if c.Name() == "vmm" {
			return c
		}
	}
	cmd := &cobra.Command{Use: "vmm", Short: "The VMM: one KVM virtual machine per process"}
	rootCmd.AddCommand(cmd)
	return cmd
}

// serveShutdownTimeout bounds how long SIGTERM waits for the instance to
// be destroyed.
const serveShutdownTimeout = time.Minute

// serveDrainTimeout bounds how long, once the instance is destroyed, the
// API stays up for watchers between two long-polls to fetch the final
// snapshot; a watcher that left without closing its connection costs that
// much.
const serveDrainTimeout = 5 * time.Second

func newVMMServeCmd() *cobra.Command {
	var listen, migrationListen, certs string
	var apiTLS bool
	cmd := &cobra.Command{
		Use:   "serve --listen ADDR --certs DIR [--api-tls]",
		Short: "Serve the HTTP control API of one VM",
		Long: `Serve the control API (PUT /v1/instance, GET /v1/instance/state, ...; see
GET /openapi.json) for one VM. --certs holds the certificate the volume
upstairs presents to its downstairs. The API is plain HTTP unless --api-tls
serves it over HTTPS, requiring client certificates from the same CA.
It also listens for live migration on --migration-listen (QUIC with mutual
TLS from the same certificates; by default a free UDP port on the API's
address) and reports that address in GET /v1/instance as migration_addr.
SIGTERM or SIGINT stops the instance cleanly and exits. The first line on
stdout is "listening on URL".`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return serveVMM(cmd, listen, migrationListen, certs, apiTLS)
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:0", "address to serve the API on (port 0 picks one)")
	cmd.Flags().StringVar(&migrationListen, "migration-listen", "", "UDP address to listen for migration on (default: a free port on the API's address)")
	cmd.Flags().StringVar(&certs, "certs", "", "certificate directory (tern certs): the volume upstairs' client certificate, and the API's with --api-tls")
	cmd.Flags().BoolVar(&apiTLS, "api-tls", false, "serve the API over HTTPS, requiring client certificates from the --certs CA")
	cmd.MarkFlagRequired("certs")
	return cmd
}

func serveVMM(cmd *cobra.Command, listen, migrationListen, certs string, apiTLS bool) error {
	log, err := newLogger(serve.ServerLogLevel)
	if err != nil {
		return err
	}
	bundle, err := tlsconf.Load(certs)
	if err != nil {
		return fmt.Errorf("loading certificates: %w", err)
	}
	host, err := instance.ProbeHost()
	if err != nil {
		log.Warn("no usable /dev/kvm: instances will fail to build", "err", err)
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("listening for the API: %w", err)
	}
	if migrationListen == "" {
		h, _, err := net.SplitHostPort(ln.Addr().String())
		if err != nil {
			ln.Close()
			return fmt.Errorf("listening for migration: %w", err)
		}
		migrationListen = net.JoinHostPort(h, "0")
	}
	mln, err := listenMigration(migrationListen, bundle)
	if err != nil {
		ln.Close()
		return err
	}
	defer mln.Close()
	versions, err := serve.MigrationProtocols()
	if err != nil {
		ln.Close()
		return err
	}
	scheme := "http"
	if apiTLS {
		scheme = "https"
	}
	url := fmt.Sprintf("%s://%s", scheme, ln.Addr())
	set := metrics.NewSet()
	srv := api.NewServer(api.Config{Host: host, VolumeTLS: bundle.ClientConfig(""), Logger: log, Metrics: set,
		Build: serve.BuildVersion(), MigrationAddr: mln.Addr().String(), MigrationVersions: versions,
		APIURL: url, SameHostSocketPrefix: sameHostSocketPrefix()})
	go acceptMigrations(mln, srv)
	hs := &http.Server{Handler: srv, ReadHeaderTimeout: 10 * time.Second, ConnState: srv.ConnState}
	if apiTLS {
		hs.TLSConfig = bundle.ServerConfig()
		ln = tls.NewListener(ln, hs.TLSConfig)
	}
	fmt.Fprintf(cmd.OutOrStdout(), "listening on %s\n", url)
	log.Info("vmm serving", "component", "vmm", "url", url, "migration_addr", mln.Addr().String())
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()

	ctx := cmd.Context()
	select {
	case err := <-served:
		srv.Close(context.Background())
		return fmt.Errorf("serving the API: %w", err)
	case <-ctx.Done():
	}
	log.Info("vmm shutting down", "component", "vmm")
	sctx, cancel := context.WithTimeout(context.Background(), serveShutdownTimeout)
	defer cancel()
	// The instance first, so watchers see it stop; then, once every
	// watcher has the final snapshot (bounded), the listener.
	errs := []error{srv.Close(sctx)}
	dctx, dcancel := context.WithTimeout(sctx, serveDrainTimeout)
	if err := srv.DrainWatchers(dctx); err != nil {
		log.Warn("shutting down with watchers behind", "component", "vmm", "err", err)
	}
	dcancel()
	if err := hs.Shutdown(sctx); err != nil {
		errs = append(errs, hs.Close())
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// listenMigration listens for migration connections: QUIC with mutual
// TLS from bundle's CA, ALPN migration.NextProto.
func listenMigration(addr string, bundle *tlsconf.Bundle) (*transport.Listener, error) {
	conf := bundle.ServerConfig()
	conf.NextProtos = []string{migration.NextProto}
	mln, err := transport.Listen(addr, conf)
	if err != nil {
		return nil, fmt.Errorf("listening for migration: %w", err)
	}
	return mln, nil
}

// acceptMigrations hands every migration connection to the API server,
// whose instance's request policy takes or refuses it, until mln is
// closed.
func acceptMigrations(mln *transport.Listener, srv *api.Server) {
	for {
		conn, err := mln.Accept(context.Background())
		if err != nil {
			return
		}
		srv.AcceptMigration(conn)
	}
}

// sameHostSocketPrefix names this process's same-host migration sockets
// in the abstract namespace: nothing is left on disk, even if the process
// is killed. The hand-over's nonce, known only to the mutual-TLS peer,
// guards them.
func sameHostSocketPrefix() string {
	var b [8]byte
	rand.Read(b[:])
	return fmt.Sprintf("@tern-vmm-%d-%x-", os.Getpid(), b)
}
