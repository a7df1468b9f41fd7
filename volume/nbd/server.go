package nbd

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"tern/volume"
)

// Export is the one export a Server offers.
type Export struct {
	// Name is the export's name; the empty name (the default export)
	// always names it too.
	Name        string
	Description string
	// Device is the volume the export serves; calls run concurrently,
	// a write is complete when WriteAt returns, and Flush makes every
	// write completed before it durable.
	Device volume.Volume
	// Size is the export's size in bytes, a multiple of BlockSize.
	Size uint64
	// BlockSize is the device's block size: a power of two from 512 to
	// 64 KiB, advertised as the minimum block size.
	BlockSize uint32
	// ReadOnly refuses writes with EPERM and says so in the flags.
	ReadOnly bool
}

// Config is what NewServer needs.
type Config struct {
	Export Export
	// TLS, when set, is the server side of mutual TLS: clients must
	// upgrade with NBD_OPT_STARTTLS before anything else.
	TLS *tls.Config
	// Logger receives the server's logs; nil discards them.
	Logger *slog.Logger
	// RequestTimeout bounds each device call; a request that runs out
	// of it fails with EIO. Zero means no bound.
	RequestTimeout time.Duration
	// HandshakeTimeout bounds negotiation (default 30 s).
	HandshakeTimeout time.Duration
	// MaxInFlight bounds the requests of one connection served at once
	// (default 128); MaxInFlightBytes bounds their payloads (default
	// 128 MiB; one request may always exceed it alone).
	MaxInFlight      int
	MaxInFlightBytes int64
}

// Defaults of Config's zero fields.
const (
	DefaultHandshakeTimeout = 30 * time.Second
	DefaultMaxInFlight      = 128
	DefaultMaxInFlightBytes = 128 << 20
)

// ErrServerClosed is returned by Serve once Shutdown has begun.
var ErrServerClosed = errors.New("nbd: server closed")

// Server serves one export over any number of listeners and connections.
// Every connection shares the export's Device, which is what makes
// CAN_MULTI_CONN true: a flush on any connection covers every write
// completed on all of them.
type Server struct {
	// Immutable after NewServer.
	cfg   Config
	log   *slog.Logger
	flags uint16 // transmission flags
	geo   geometry
	// base is the context of every device call; cancel ends them when
	// a shutdown runs out of time.
	base   context.Context
	cancel context.CancelFunc
	stats  counters

	mu sync.Mutex
	// closing is set by Shutdown; no listener or connection is added
	// after it.
	closing   bool
	listeners map[net.Listener]struct{}
	conns     map[*conn]struct{}
	nextID    uint64
	// connsDone is closed, and replaced, whenever conns becomes empty.
	connsDone chan struct{}
}

// NewServer checks cfg and returns a server that is not yet listening.
func NewServer(cfg Config) (*Server, error) {
	e := cfg.Export
	var problems []error
	if e.Device == nil {
		problems = append(problems, errors.New("export: no device"))
	}
	if bs := e.BlockSize; bs < 512 || bs > 64<<10 || bs&(bs-1) != 0 {
		problems = append(problems, fmt.Errorf("export: block size %d is not a power of two from 512 to 64 KiB", bs))
	} else if e.Size%uint64(bs) != 0 {
		problems = append(problems, fmt.Errorf("export: size %d is not a multiple of the block size %d", e.Size, bs))
	}
	if len(e.Name) > maxNameBytes {
		problems = append(problems, fmt.Errorf("export: name of %d bytes, longer than %d", len(e.Name), maxNameBytes))
	}
	if err := errors.Join(problems...); err != nil {
		return nil, fmt.Errorf("nbd: %w", err)
	}
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = DefaultMaxInFlight
	}
	if cfg.MaxInFlightBytes <= 0 {
		cfg.MaxInFlightBytes = DefaultMaxInFlightBytes
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	flags := FlagHasFlags | FlagSendFlush | FlagCanMultiConn
	if e.ReadOnly {
		flags |= FlagReadOnly
	} else {
		flags |= FlagSendFUA | FlagSendTrim | FlagSendWriteZeroes
	}
	base, cancel := context.WithCancel(context.Background())
	return &Server{
		cfg: cfg, log: log, flags: flags,
		geo:       geometry{size: e.Size, blockSize: e.BlockSize, readOnly: e.ReadOnly},
		base:      base,
		cancel:    cancel,
		listeners: map[net.Listener]struct{}{},
		conns:     map[*conn]struct{}{},
		connsDone: make(chan struct{}),
	}, nil
}

// TransmissionFlags are the flags the export is advertised with.
func (s *Server) TransmissionFlags() uint16 { return s.flags }

// Serve accepts connections on ln until Shutdown, serving each on its
// own goroutines; it returns ErrServerClosed after Shutdown, or the
// listener's error. Serve closes ln.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		ln.Close()
		return ErrServerClosed
	}
	s.listeners[ln] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, ln)
		s.mu.Unlock()
		ln.Close()
	}()
	var backoff time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			s.mu.Lock()
			closing := s.closing
			s.mu.Unlock()
			if closing {
				return ErrServerClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				s.log.Warn("accepting a connection", "err", err, "retry_in", backoff)
				time.Sleep(backoff)
				continue
			}
			return fmt.Errorf("accepting connections: %w", err)
		}
		backoff = 0
		c := s.track(nc)
		if c == nil {
			nc.Close()
			continue
		}
		go c.run()
	}
}

// track registers a new connection, or returns nil once closing.
func (s *Server) track(nc net.Conn) *conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return nil
	}
	s.nextID++
	c := newConn(s, nc, s.nextID)
	s.conns[c] = struct{}{}
	s.stats.connections.Add(1)
	s.stats.accepted.Add(1)
	return c
}

// untrack removes a finished connection.
func (s *Server) untrack(c *conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.conns, c)
	s.stats.connections.Add(-1)
	if len(s.conns) == 0 {
		close(s.connsDone)
		s.connsDone = make(chan struct{})
	}
}

// Shutdown stops accepting, lets every connection finish the requests it
// has read (no new ones are read) and send their replies, then closes the
// connections. If ctx ends first, device calls still running are
// cancelled (their requests fail), every connection is closed, and
// Shutdown returns ctx's error once all are gone. It does not flush the
// device: the caller does, after Shutdown, so the flush covers every
// write that was acknowledged.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.closing = true
	for ln := range s.listeners {
		ln.Close()
	}
	for c := range s.conns {
		c.stopReading()
	}
	empty := len(s.conns) == 0
	done := s.connsDone
	s.mu.Unlock()
	if empty {
		return nil
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
	}
	s.cancel()
	s.mu.Lock()
	for c := range s.conns {
		c.nc.Close()
	}
	empty = len(s.conns) == 0
	done = s.connsDone
	s.mu.Unlock()
	if !empty {
		<-done
	}
	return ctx.Err()
}

// Stats is a snapshot of what the server has served since it started.
type Stats struct {
	Connections     int64 // open now
	Accepted        int64 // ever
	Reads, Writes   int64 // completed requests (WRITE_ZEROES counts as a write)
	Flushes, Trims  int64
	Errors          int64 // requests answered with an error
	BytesRead       int64
	BytesWritten    int64
	Disconnected    int64 // connections ended for a protocol violation
	HandshakeFailed int64
}

type counters struct {
	connections, accepted                 atomic.Int64
	reads, writes, flushes, trims, errors atomic.Int64
	bytesRead, bytesWritten               atomic.Int64
	disconnected, handshakeFailed         atomic.Int64
}

// Stats returns the server's counters.
func (s *Server) Stats() Stats {
	c := &s.stats
	return Stats{
		Connections: c.connections.Load(), Accepted: c.accepted.Load(),
		Reads: c.reads.Load(), Writes: c.writes.Load(), Flushes: c.flushes.Load(), Trims: c.trims.Load(),
		Errors: c.errors.Load(), BytesRead: c.bytesRead.Load(), BytesWritten: c.bytesWritten.Load(),
		Disconnected: c.disconnected.Load(), HandshakeFailed: c.handshakeFailed.Load(),
	}
}
