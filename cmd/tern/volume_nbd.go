package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"tern/cmd/internal/serve"
	"tern/internal/telemetry"
	"tern/internal/tlsconf"
	"tern/internal/units"
	"tern/volume"
	"tern/volume/layout"
	"tern/volume/nbd"
	"tern/volume/reconcile"
)

// How `tern volume nbd` spends the 10 s a stop may take: finish the
// requests in flight, then flush, then deactivate.
const (
	nbdDrainTimeout      = 6 * time.Second
	nbdFlushTimeout      = 2 * time.Second
	nbdDeactivateTimeout = 1500 * time.Millisecond
)

// nbdFlags are the flags of `tern volume nbd` beyond the volume's own.
type nbdFlags struct {
	listen    string
	export    string
	readOnly  bool
	tls       bool
	ioTimeout time.Duration
	stats     time.Duration
}

func newVolumeNBDCmd() *cobra.Command {
	var (
		vf volumeFlags
		f  nbdFlags
	)
	cmd := &cobra.Command{
		Use:   "nbd",
		Short: "Serve the volume over NBD to qemu-img, qemu, fio, nbdcopy, nbdfuse and other NBD clients",
		Long: "Activate the volume with --gen and serve it over the NBD protocol on --listen (host:port or " +
			"unix:/path) until SIGINT or SIGTERM, then finish the requests in flight, flush, deactivate and " +
			"exit. Every connection shares the one upstairs, so a flush on any connection covers the writes " +
			"completed on all of them. Without --tls only loopback addresses and unix sockets are served; with " +
			"--tls every client must upgrade with STARTTLS and present a certificate from --certs' CA.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runVolumeNBD(cmd, &vf, &f) },
	}
	vf.register(cmd)
	fs := cmd.Flags()
	fs.StringVar(&f.listen, "listen", "", "address to serve NBD on: host:port or unix:/path")
	fs.StringVar(&f.export, "export", "", "export name (default: the default export, the empty name)")
	fs.BoolVar(&f.readOnly, "read-only", false, "refuse writes (EPERM) and advertise the export read-only")
	fs.BoolVar(&f.tls, "tls", false, "require STARTTLS with mutual TLS from --certs (needed to listen beyond loopback)")
	fs.DurationVar(&f.ioTimeout, "io-timeout", defaultIOTimeout, "how long one request may wait for a quorum before it fails with EIO")
	fs.DurationVar(&f.stats, "stats", 10*time.Second, "print IOPS and MiB/s served every interval with traffic (0: never)")
	_ = cmd.MarkFlagRequired("listen")
	return cmd
}

// nbdAddr is a parsed --listen.
type nbdAddr struct {
	network, address string
}

// parseNBDListen reads --listen and refuses, in one line, an address
// beyond loopback without TLS.
func parseNBDListen(listen string, withTLS bool) (nbdAddr, error) {
	if path, ok := strings.CutPrefix(listen, "unix:"); ok {
		if path == "" {
			return nbdAddr{}, fmt.Errorf("--listen %q: want unix:/path, the socket path is missing", listen)
		}
		return nbdAddr{"unix", path}, nil
	}
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return nbdAddr{}, fmt.Errorf("--listen %q: want host:port or unix:/path", listen)
	}
	if _, err := net.LookupPort("tcp", port); err != nil {
		return nbdAddr{}, fmt.Errorf("--listen %q: port %q is not a number from 0 to 65535", listen, port)
	}
	if !withTLS && !isLoopbackHost(host) {
		return nbdAddr{}, fmt.Errorf("--listen %q: not a loopback address, and without --tls anyone who reaches it could read and write the volume: use --tls, a loopback address or unix:/path", listen)
	}
	return nbdAddr{"tcp", listen}, nil
}

func isLoopbackHost(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// listenNBD opens the listener. A unix socket left by a process that
// died is replaced; one a live server answers on is not.
func listenNBD(a nbdAddr) (net.Listener, error) {
	ln, err := net.Listen(a.network, a.address)
	if err != nil && a.network == "unix" && errors.Is(err, syscall.EADDRINUSE) {
		if c, derr := net.Dial("unix", a.address); derr == nil {
			c.Close()
			return nil, fmt.Errorf("listening on unix:%s: another server is serving it", a.address)
		}
		if fi, serr := os.Lstat(a.address); serr == nil && fi.Mode()&os.ModeSocket != 0 {
			_ = os.Remove(a.address)
			ln, err = net.Listen(a.network, a.address)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("listening: %w", err)
	}
	return ln, nil
}

// nbdURI is the URI clients open for the export served on ln.
func nbdURI(ln net.Listener, export string, withTLS bool) string {
	scheme := "nbd"
	if withTLS {
		scheme = "nbds"
	}
	if ln.Addr().Network() == "unix" {
		return fmt.Sprintf("%s+unix:///%s?socket=%s", scheme, export, ln.Addr().String())
	}
	return fmt.Sprintf("%s://%s/%s", scheme, ln.Addr().String(), export)
}

func (f *nbdFlags) check() (nbdAddr, error) {
	var problems []string
	a, err := parseNBDListen(f.listen, f.tls)
	if err != nil {
		problems = append(problems, err.Error())
	}
	if len(f.export) > 4096 {
		problems = append(problems, fmt.Sprintf("--export: %d bytes, longer than the protocol's 4096", len(f.export)))
	}
	if f.ioTimeout <= 0 {
		problems = append(problems, fmt.Sprintf("--io-timeout %v: must be positive", f.ioTimeout))
	}
	if f.stats < 0 {
		problems = append(problems, fmt.Sprintf("--stats %v: must not be negative", f.stats))
	}
	return a, problemsError(problems)
}

// runVolumeNBD checks the flags, opens the listener, activates the volume
// the way every volume command does, and serves it until the command's
// context ends (SIGINT, SIGTERM).
func runVolumeNBD(cmd *cobra.Command, vf *volumeFlags, f *nbdFlags) error {
	ctx := cmd.Context()
	stderr := cmd.ErrOrStderr()
	addr, err := f.check()
	if err != nil {
		return err
	}
	if err := vf.check(); err != nil {
		return err
	}
	var serverTLS *tls.Config
	if f.tls {
		b, err := tlsconf.Load(vf.certs)
		if err != nil {
			return fmt.Errorf("loading certificates: %w", err)
		}
		serverTLS = b.ServerConfig()
	}
	log, err := newLogger(serve.ServerLogLevel)
	if err != nil {
		return err
	}
	// Listen before activating: a port in use must not cost a generation.
	ln, err := listenNBD(addr)
	if err != nil {
		return err
	}
	defer ln.Close()
	tune := func(cfg *layout.Config) { cfg.DeactivateTimeout = nbdDeactivateTimeout }
	p, err := vf.prepare(ctx, nil, tune)
	if err != nil {
		return err
	}
	up := p.io()
	defer up.Close()
	if err := activateShowingProgress(ctx, p, stderr); err != nil {
		return err
	}
	bs := p.region.BlockSize
	size := p.region.Blocks() * uint64(bs)
	cfg := nbd.Config{
		Export: nbd.Export{
			Name: f.export, Device: up, Size: size, BlockSize: bs, ReadOnly: f.readOnly,
			Description: fmt.Sprintf("tern volume %s", p.region.UUID),
		},
		TLS:            serverTLS,
		Logger:         telemetry.Component(log, "nbd"),
		RequestTimeout: f.ioTimeout,
	}
	srv, err := nbd.NewServer(cfg)
	if err != nil {
		return err
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	mode := "read-write"
	if f.readOnly {
		mode = "read-only"
	}
	fmt.Fprintf(stderr, "volume active on %s: %s in %s blocks\n", p.activeSummary(), units.FormatBytes(size), units.FormatBytes(uint64(bs)))
	fmt.Fprintf(cmd.OutOrStdout(), "serving %s (%s)\n", nbdURI(ln, f.export, f.tls), mode)
	log.Info("listening", "component", "nbd", "addr", ln.Addr().String(), "uri", nbdURI(ln, f.export, f.tls))

	var serveErr error
	statsDone := make(chan struct{})
	go func() {
		defer close(statsDone)
		printNBDStats(ctx, stderr, srv, f.stats)
	}()
	select {
	case <-ctx.Done():
	case serveErr = <-served:
	}
	<-statsDone
	return stopNBD(srv, up, served, serveErr, stderr)
}

// stopNBD ends the service within nbdDrainTimeout + nbdFlushTimeout +
// nbdDeactivateTimeout: stop accepting and reading, finish what was
// read, flush what was acknowledged, deactivate.
func stopNBD(srv *nbd.Server, up volume.Volume, served <-chan error, serveErr error, stderr io.Writer) error {
	fmt.Fprintln(stderr, "stopping: finishing the requests in flight")
	drain, cancel := context.WithTimeout(context.Background(), nbdDrainTimeout)
	drainErr := srv.Shutdown(drain)
	cancel()
	if serveErr == nil {
		<-served
	}
	flushCtx, cancel := context.WithTimeout(context.Background(), nbdFlushTimeout)
	flushErr := up.Flush(flushCtx)
	cancel()
	closeErr := up.Close()
	switch {
	case serveErr != nil && !errors.Is(serveErr, nbd.ErrServerClosed):
		return serveErr
	case flushErr != nil:
		return fmt.Errorf("final flush: %w", flushErr)
	case closeErr != nil:
		return fmt.Errorf("deactivating volume: %w", closeErr)
	}
	st := srv.Stats()
	if drainErr != nil {
		fmt.Fprintf(stderr, "stopped: requests still running after %v were failed\n", nbdDrainTimeout)
	}
	fmt.Fprintf(stderr, "stopped: served %d reads (%s) and %d writes (%s) to %d clients; flushed and deactivated\n",
		st.Reads, units.FormatBytes(uint64(st.BytesRead)), st.Writes, units.FormatBytes(uint64(st.BytesWritten)), st.Accepted)
	return nil
}

// activateShowingProgress activates the volume (the shared path of every
// volume command) and prints each activation phase on w as it starts.
func activateShowingProgress(ctx context.Context, p *preparedVolume, w io.Writer) error {
	subscribe := func(n int) (<-chan reconcile.Progress, func()) {
		if p.ev != nil {
			return p.ev.SubscribeActivation(n)
		}
		return p.up.SubscribeActivation(n)
	}
	updates, unsubscribe := subscribe(16)
	shown := make(chan struct{})
	go func() {
		defer close(shown)
		var last reconcile.Phase
		for pr := range updates {
			if pr.Phase == last {
				continue
			}
			last = pr.Phase
			switch {
			case pr.Phase == reconcile.PhaseNegotiating:
				fmt.Fprintln(w, "activating: negotiating with the replicas")
			case pr.Phase == reconcile.PhaseRepairing && pr.ExtentsTotal > 0:
				fmt.Fprintf(w, "activating: repairing %d extents on which the replicas differ\n", pr.ExtentsTotal)
			case pr.Phase == reconcile.PhaseDone && pr.ExtentsTotal == 0:
				fmt.Fprintln(w, "activating: done, the replicas agree")
			case pr.Phase == reconcile.PhaseDone:
				fmt.Fprintf(w, "activating: done, repaired %d of %d extents\n", pr.ExtentsDone, pr.ExtentsTotal)
			}
		}
	}()
	err := p.activate(ctx)
	unsubscribe()
	<-shown
	return err
}

// printNBDStats prints, every interval in which something was served, one
// line of IOPS and MiB/s, until ctx ends.
func printNBDStats(ctx context.Context, w io.Writer, srv *nbd.Server, interval time.Duration) {
	if interval <= 0 {
		<-ctx.Done()
		return
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	prev, prevAt := srv.Stats(), time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			st := srv.Stats()
			secs := now.Sub(prevAt).Seconds()
			ops := st.Reads + st.Writes + st.Flushes + st.Trims - (prev.Reads + prev.Writes + prev.Flushes + prev.Trims)
			if ops > 0 {
				fmt.Fprintf(w, "nbd: %.0f IOPS, read %.1f MiB/s, written %.1f MiB/s, %d clients, %d errors\n",
					float64(ops)/secs,
					float64(st.BytesRead-prev.BytesRead)/(1<<20)/secs,
					float64(st.BytesWritten-prev.BytesWritten)/(1<<20)/secs,
					st.Connections, st.Errors-prev.Errors)
			}
			prev, prevAt = st, now
		}
	}
}
