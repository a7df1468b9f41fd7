package telemetry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/VictoriaMetrics/metrics"
)

// NewLogger returns a JSON logger writing to w at level and above.
func NewLogger(w io.Writer, level slog.Level) *slog.Logger {
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level}))
}

// Component returns l tagged with the subsystem name, the attribute every
// tern log line carries ("component":"downstairs").
func Component(l *slog.Logger, name string) *slog.Logger {
	if l == nil {
		l = slog.New(slog.DiscardHandler)
	}
	return l.With("component", name)
}

// ParseLevel reads a --log-level value: debug, info, warn or error.
func ParseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(strings.ToLower(strings.TrimSpace(s)))); err != nil {
		return 0, fmt.Errorf("parsing log level %q: want debug, info, warn or error", s)
	}
	return l, nil
}

// MetricsHandler serves set (and the process metrics) in Prometheus text.
func MetricsHandler(set *metrics.Set) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		set.WritePrometheus(w)
		metrics.WriteProcessMetrics(w)
	})
}

// MetricsServer serves /metrics for one set on its own listener.
type MetricsServer struct {
	srv       *http.Server
	done      chan error
	closeOnce sync.Once
	closeErr  error
}

// ServeMetrics starts serving set at /metrics on ln until Close.
func ServeMetrics(ln net.Listener, set *metrics.Set) *MetricsServer {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", MetricsHandler(set))
	s := &MetricsServer{
		srv:  &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second},
		done: make(chan error, 1),
	}
	go func() { s.done <- s.srv.Serve(ln) }()
	return s
}

// Close stops the server and waits for its goroutine to end. Calling it
// again returns the first call's result.
func (s *MetricsServer) Close() error {
	s.closeOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		err := s.srv.Shutdown(ctx)
		if serr := <-s.done; !errors.Is(serr, http.ErrServerClosed) && err == nil {
			err = serr
		}
		s.closeErr = err
	})
	return s.closeErr
}
