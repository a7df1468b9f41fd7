package ec

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"

	"tern/volume"
	"tern/volume/transport"
	"tern/volume/wire"
)

// Config is what New needs. Zero values of optional fields take the
// replicated volume's defaults (volume.Default*).
type Config struct {
	// Layout is the number of data and parity shards.
	Layout Layout
	// Targets are the shards' downstairs (host:port), Layout.Shards() of
	// them: Targets[i] is shard i, the data shards first.
	Targets []string
	// TLS is the client configuration for mutual TLS. Required.
	TLS *tls.Config
	// UpstairsID identifies this upstairs to the downstairs; zero picks a
	// random one.
	UpstairsID uuid.UUID
	// Region is the region every shard must serve (zero fields accept
	// what they agree on). Every shard's region has the same geometry.
	Region wire.RegionInfo
	// Logger receives structured logs; nil discards them.
	Logger *slog.Logger
	// ActivationQuorumWait is how long Activate waits for every shard
	// before activating with the Layout.Data or more that answered.
	ActivationQuorumWait time.Duration
	// ReconnectMin and ReconnectMax bound the reconnect backoff.
	ReconnectMin, ReconnectMax time.Duration
	// ReplyTimeout bounds how long a shard may take to answer one
	// request before its session is dropped (its blocks are then
	// reconstructed from the others, and it is repaired when back).
	ReplyTimeout time.Duration
	// KeepAlivePeriod and IdleTimeout: how often a quiet connection is
	// pinged and how long a silent one lives (transport.DialOptions).
	KeepAlivePeriod, IdleTimeout time.Duration
	// DeactivateTimeout bounds the flush Close does.
	DeactivateTimeout time.Duration
	// Network is where the shard connections' sockets come from; nil is
	// the host's UDP (volume/sim's simulated network otherwise).
	Network transport.Network
}

func (cfg Config) withDefaults() (Config, error) {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if err := cfg.Layout.Validate(); err != nil {
		bad("layout: %w", err)
	} else if len(cfg.Targets) != cfg.Layout.Shards() {
		bad("targets: layout %v wants %d addresses, got %d", cfg.Layout, cfg.Layout.Shards(), len(cfg.Targets))
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
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	def := func(d *time.Duration, v time.Duration, name string) {
		switch {
		case *d < 0:
			bad("%s %v: must not be negative", name, *d)
		case *d == 0:
			*d = v
		}
	}
	def(&cfg.ActivationQuorumWait, volume.DefaultActivationQuorumWait, "activation quorum wait")
	def(&cfg.ReconnectMin, volume.DefaultReconnectMin, "reconnect min")
	def(&cfg.ReconnectMax, max(volume.DefaultReconnectMax, cfg.ReconnectMin), "reconnect max")
	def(&cfg.ReplyTimeout, volume.DefaultReplyTimeout, "reply timeout")
	def(&cfg.IdleTimeout, transport.IdleTimeout, "idle timeout")
	def(&cfg.KeepAlivePeriod, min(transport.KeepAlivePeriod, cfg.IdleTimeout/2), "keepalive")
	def(&cfg.DeactivateTimeout, volume.DefaultDeactivateTimeout, "deactivate timeout")
	if cfg.KeepAlivePeriod >= cfg.IdleTimeout {
		bad("keepalive %v: must be shorter than the idle timeout %v", cfg.KeepAlivePeriod, cfg.IdleTimeout)
	}
	if len(errs) > 0 {
		return cfg, fmt.Errorf("%w: %w", ErrInvalidConfig, errors.Join(errs...))
	}
	return cfg, nil
}
