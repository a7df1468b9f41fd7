package downstairs

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"sync"

	"github.com/VictoriaMetrics/metrics"
	"github.com/quic-go/quic-go"

	"tern/volume/extent"
	"tern/volume/ids"
	"tern/volume/transport"
	"tern/volume/wire"
)

// Defaults of Config.
const (
	// DefaultMaxJobsPerSession bounds the requests one session may have
	// between decode and reply; with 1 MiB writes that bounds its buffers
	// to 128 MiB. A peer that sends more is slowed by QUIC flow control.
	DefaultMaxJobsPerSession = 128
)

// Config configures a downstairs.
type Config struct {
	// Dir is the region directory (made by Create). Used by Run.
	Dir string
	// Listen is the UDP address to serve on, host:port. Used by Run.
	Listen string
	// TLS is the server's mutual-TLS configuration (tlsconf's
	// ServerConfig); it must require and verify client certificates.
	// Used by Run.
	TLS *tls.Config
	// Logger receives structured logs; nil discards them.
	Logger *slog.Logger
	// Metrics receives the server's metrics; nil keeps them private.
	Metrics *metrics.Set
	// Workers bounds the jobs executing at once across all sessions; zero
	// means 4 per CPU (IO-bound work, so more than the CPU count).
	Workers int
	// MaxJobsPerSession bounds a session's outstanding requests; zero
	// means DefaultMaxJobsPerSession.
	MaxJobsPerSession int
}

// Create makes a new region in dir (see extent.Create) and closes it.
func Create(dir string, spec extent.Spec) error {
	r, err := extent.Create(dir, spec)
	if err != nil {
		return fmt.Errorf("create downstairs region: %w", err)
	}
	if err := r.Close(); err != nil {
		return fmt.Errorf("create downstairs region: %w", err)
	}
	return nil
}

// Server serves one region to upstairs sessions. It does not own the
// region: the caller opens it before NewServer and closes it after Serve
// returns.
type Server struct {
	// Immutable after NewServer.
	region  *extent.Region
	spec    extent.Spec
	log     *slog.Logger
	metrics *serverMetrics
	workers int
	maxJobs int
	bufs    bufPool
	work    chan *job // owners → workers; closed when Serve's sessions are gone

	fence fence // which session may mutate; see fence.go
}

// NewServer returns a server for region using cfg's Logger, Metrics,
// Workers and MaxJobsPerSession.
func NewServer(region *extent.Region, cfg Config) *Server {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	set := cfg.Metrics
	if set == nil {
		set = metrics.NewSet()
	}
	srv := &Server{
		region:  region,
		spec:    region.Spec(),
		log:     log.With("component", "downstairs"),
		workers: cfg.Workers,
		maxJobs: cfg.MaxJobsPerSession,
	}
	if srv.workers <= 0 {
		srv.workers = 4 * runtime.GOMAXPROCS(0)
	}
	if srv.maxJobs <= 0 {
		srv.maxJobs = DefaultMaxJobsPerSession
	}
	srv.metrics = newServerMetrics(set, srv)
	return srv
}

// Serve accepts connections from ln and serves each until ctx is
// cancelled; then it closes every session, waits for the jobs in flight
// and its workers, and returns nil. It does not close ln. Serve runs at
// most once per Server.
func (srv *Server) Serve(ctx context.Context, ln *transport.Listener) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	srv.work = make(chan *job)
	var workers, sessions sync.WaitGroup
	for range srv.workers {
		workers.Go(func() {
			for j := range srv.work {
				j.execute(srv)
				j.sess.completions <- j
			}
		})
	}
	var err error
	for {
		var conn *quic.Conn
		conn, err = ln.Accept(ctx)
		if err != nil {
			break
		}
		sessions.Go(func() { srv.serveConn(ctx, conn) })
	}
	cancel()
	sessions.Wait()
	close(srv.work)
	workers.Wait()
	if ctx.Err() != nil && errors.Is(err, context.Canceled) {
		return nil
	}
	return fmt.Errorf("serve region: %w", err)
}

// Run opens the region in cfg.Dir, listens on cfg.Listen with cfg.TLS,
// logs "listening" once connections are accepted, and serves until ctx is
// cancelled; then it stops cleanly and closes the region.
func Run(ctx context.Context, cfg Config) (err error) {
	if cfg.TLS == nil {
		return errors.New("run downstairs: no TLS configuration")
	}
	region, err := extent.Open(cfg.Dir)
	if err != nil {
		return fmt.Errorf("run downstairs: %w", err)
	}
	defer func() {
		if cerr := region.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("close region: %w", cerr)
		}
	}()
	ln, err := transport.Listen(cfg.Listen, cfg.TLS)
	if err != nil {
		return fmt.Errorf("run downstairs: %w", err)
	}
	defer ln.Close()
	srv := NewServer(region, cfg)
	spec := region.Spec()
	srv.log.Info("listening",
		"addr", ln.Addr().String(),
		"region", spec.UUID.String(),
		"block_size", spec.BlockSize,
		"extent_blocks", spec.ExtentBlocks,
		"extent_count", spec.ExtentCount,
		"highest_gen", uint64(region.HighestGen()),
	)
	err = srv.Serve(ctx, ln)
	srv.log.Info("stopped")
	return err
}

// regionInfo returns the served region's geometry.
func (srv *Server) regionInfo() wire.RegionInfo { return regionInfoOf(srv.spec) }

// sessionGen returns the generation s activated with (0 if it did not).
func (srv *Server) sessionGen(s *session) ids.Generation {
	srv.fence.mu.RLock()
	defer srv.fence.mu.RUnlock()
	return s.gen
}

// activeSession reports whether some session is active.
func (srv *Server) activeSession() bool {
	srv.fence.mu.RLock()
	defer srv.fence.mu.RUnlock()
	return srv.fence.active != nil
}
