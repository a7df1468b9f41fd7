package upstairs

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/google/uuid"

	"tern/volume"
	"tern/volume/transport"
	"tern/volume/upstairs/engine"
	"tern/volume/wire"
)

// Defaults for the zero values of Config (those every layout shares are
// the volume package's).
const (
	// DefaultBacklogJobs is how many jobs an Offline replica may owe before
	// it is faulted (Crucible's limit).
	DefaultBacklogJobs = 1000
	// DefaultBacklogBytes is how many bytes of jobs an Offline replica may
	// owe before it is faulted.
	DefaultBacklogBytes = 64 << 20
	// DefaultActivationQuorumWait is how long Activate waits for all three
	// replicas before going ahead with two.
	DefaultActivationQuorumWait = volume.DefaultActivationQuorumWait
	// DefaultReconnectMin and DefaultReconnectMax bound the reconnect
	// backoff, which doubles from min to max.
	DefaultReconnectMin = volume.DefaultReconnectMin
	DefaultReconnectMax = volume.DefaultReconnectMax
	// DefaultDeactivateTimeout bounds the flush and drain Close does.
	DefaultDeactivateTimeout = volume.DefaultDeactivateTimeout
	// DefaultReplyTimeout is how long a downstairs may leave a request
	// unanswered before its session is dropped (QUIC's keepalive only
	// proves the peer's stack is alive, not that it serves). A dead or
	// silent downstairs is noticed sooner, by the connection's idle
	// timeout (DefaultIdleTimeout); this bounds one that is alive but
	// stuck, and leaves a slow disk on a busy machine room.
	DefaultReplyTimeout = volume.DefaultReplyTimeout
	// DefaultKeepAlivePeriod and DefaultIdleTimeout are how often a quiet
	// downstairs connection is pinged and how long it may stay silent
	// (no packet at all, not even an acknowledgement) before it is
	// dropped: a killed downstairs is noticed within DefaultIdleTimeout.
	DefaultKeepAlivePeriod = transport.KeepAlivePeriod
	DefaultIdleTimeout     = transport.IdleTimeout
)

// maxBacklogJobs keeps a flush's dependency list within wire.MaxDeps: the
// engine lets at most twice the backlog be live.
const maxBacklogJobs = wire.MaxDeps/2 - 16

// Config is what New needs. Zero values of optional fields take defaults.
type Config struct {
	// Targets are the addresses (host:port) of the three downstairs, in a
	// fixed order: Targets[i] is replica i.
	Targets []string
	// TLS is the client configuration for mutual TLS (with a client
	// certificate and the CA of the downstairs). Required.
	TLS *tls.Config
	// UpstairsID identifies this upstairs to the downstairs; zero picks a
	// random one.
	UpstairsID uuid.UUID
	// Region, if its UUID or BlockSize is set, is the region the replicas
	// must serve: a non-zero UUID, BlockSize, ExtentBlocks or ExtentCount
	// must match. Zero fields accept what the replicas agree on.
	Region wire.RegionInfo
	// Logger receives structured logs; nil discards them.
	Logger *slog.Logger
	// Metrics receives IO counters and latency histograms; nil keeps them
	// in a private set.
	Metrics *metrics.Set
	// BacklogJobs and BacklogBytes bound what an Offline replica may owe
	// before it is faulted; twice as much may be in flight before WriteAt
	// blocks (backpressure).
	BacklogJobs  int
	BacklogBytes int64
	// ActivationQuorumWait is how long Activate waits for all three
	// replicas before activating with two (the third then needs repair).
	ActivationQuorumWait time.Duration
	// ReconnectMin and ReconnectMax bound the reconnect backoff.
	ReconnectMin time.Duration
	ReconnectMax time.Duration
	// DeactivateTimeout bounds how long Close flushes and waits for
	// connected replicas to answer everything they were sent.
	DeactivateTimeout time.Duration
	// ReplyTimeout bounds how long a downstairs may leave a request
	// unanswered: each handshake reply, and in the IO phase the oldest
	// job or call it owes (checked at least once per timeout). Its
	// session is then dropped: reads move to a peer and writes wait in
	// the Offline backlog, so a stalled replica cannot hold reads, or
	// through backpressure all IO, for longer.
	ReplyTimeout time.Duration
	// KeepAlivePeriod is how often a quiet downstairs connection is
	// pinged, and IdleTimeout how long it may go without any packet from
	// the downstairs before it is dropped (the replica goes Offline, as
	// on any lost connection). The idle timeout is what notices a
	// downstairs that was killed, hung or cut off; keepalives keep a live
	// one from tripping it. A slow or emulated host may lengthen both
	// (a tern downstairs accepts up to transport.ListenIdleTimeout).
	KeepAlivePeriod time.Duration
	IdleTimeout     time.Duration
	// RepairWholeExtents makes activation reconciliation and live repair
	// copy every block of an extent that needs repair (Crucible's way)
	// instead of comparing block hashes and copying only the blocks that
	// differ. Everything else is the same; benchmarks compare the two.
	RepairWholeExtents bool
}

// withDefaults returns cfg with defaults filled in and every problem found,
// joined into one error wrapping ErrInvalidConfig.
func (cfg Config) withDefaults() (Config, error) {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf(format, args...))
	}
	if len(cfg.Targets) != engine.ReplicaCount {
		bad("targets: want %d addresses, got %d", engine.ReplicaCount, len(cfg.Targets))
	}
	seen := map[string]int{}
	for i, t := range cfg.Targets {
		if t == "" {
			bad("targets[%d]: empty address", i)
			continue
		}
		if j, dup := seen[t]; dup {
			bad("targets[%d]: %q repeats targets[%d]", i, t, j)
		}
		seen[t] = i
	}
	if cfg.TLS == nil {
		bad("tls: a client configuration is required")
	}
	if cfg.UpstairsID == uuid.Nil {
		cfg.UpstairsID = uuid.New()
	}
	if bs := cfg.Region.BlockSize; bs != 0 && (bs < 512 || bs&(bs-1) != 0) {
		bad("region block size %d: want a power of two of at least 512", bs)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Metrics == nil {
		cfg.Metrics = metrics.NewSet()
	}
	switch {
	case cfg.BacklogJobs < 0:
		bad("backlog jobs %d: must not be negative", cfg.BacklogJobs)
	case cfg.BacklogJobs > maxBacklogJobs:
		bad("backlog jobs %d: at most %d", cfg.BacklogJobs, maxBacklogJobs)
	case cfg.BacklogJobs == 0:
		cfg.BacklogJobs = DefaultBacklogJobs
	}
	switch {
	case cfg.BacklogBytes < 0:
		bad("backlog bytes %d: must not be negative", cfg.BacklogBytes)
	case cfg.BacklogBytes > 0 && cfg.BacklogBytes < wire.MaxDataSize:
		bad("backlog bytes %d: at least %d (one IO)", cfg.BacklogBytes, wire.MaxDataSize)
	case cfg.BacklogBytes == 0:
		cfg.BacklogBytes = DefaultBacklogBytes
	}
	if cfg.ActivationQuorumWait < 0 {
		bad("activation quorum wait %v: must not be negative", cfg.ActivationQuorumWait)
	} else if cfg.ActivationQuorumWait == 0 {
		cfg.ActivationQuorumWait = DefaultActivationQuorumWait
	}
	if cfg.ReconnectMin < 0 || cfg.ReconnectMax < 0 {
		bad("reconnect backoff %v..%v: must not be negative", cfg.ReconnectMin, cfg.ReconnectMax)
	}
	if cfg.ReconnectMin == 0 {
		cfg.ReconnectMin = DefaultReconnectMin
	}
	if cfg.ReconnectMax == 0 {
		cfg.ReconnectMax = max(DefaultReconnectMax, cfg.ReconnectMin)
	}
	if cfg.DeactivateTimeout < 0 {
		bad("deactivate timeout %v: must not be negative", cfg.DeactivateTimeout)
	} else if cfg.DeactivateTimeout == 0 {
		cfg.DeactivateTimeout = DefaultDeactivateTimeout
	}
	if cfg.ReplyTimeout < 0 {
		bad("reply timeout %v: must not be negative", cfg.ReplyTimeout)
	} else if cfg.ReplyTimeout == 0 {
		cfg.ReplyTimeout = DefaultReplyTimeout
	}
	switch {
	case cfg.KeepAlivePeriod < 0 || cfg.IdleTimeout < 0:
		bad("keepalive %v, idle timeout %v: must not be negative", cfg.KeepAlivePeriod, cfg.IdleTimeout)
	default:
		if cfg.IdleTimeout == 0 {
			cfg.IdleTimeout = DefaultIdleTimeout
		}
		if cfg.KeepAlivePeriod == 0 {
			cfg.KeepAlivePeriod = min(DefaultKeepAlivePeriod, cfg.IdleTimeout/2)
		}
		if cfg.KeepAlivePeriod >= cfg.IdleTimeout {
			bad("keepalive %v: must be shorter than the idle timeout %v", cfg.KeepAlivePeriod, cfg.IdleTimeout)
		}
	}
	if cfg.ReconnectMax < cfg.ReconnectMin {
		bad("reconnect backoff: max %v below min %v", cfg.ReconnectMax, cfg.ReconnectMin)
	}
	if len(errs) > 0 {
		return cfg, fmt.Errorf("%w: %w", ErrInvalidConfig, errors.Join(errs...))
	}
	return cfg, nil
}

func (cfg Config) limits() engine.Limits {
	return engine.Limits{
		BacklogJobs:   cfg.BacklogJobs,
		BacklogBytes:  int(cfg.BacklogBytes),
		InflightJobs:  2 * cfg.BacklogJobs,
		InflightBytes: int(2 * cfg.BacklogBytes),
	}
}
