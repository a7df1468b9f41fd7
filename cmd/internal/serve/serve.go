package serve

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"tern/internal/telemetry"
	"tern/internal/tlsconf"
)

// Default log levels: a server's log is its record of what happened; a
// client command's one-line result should not drown in it, so it shows
// only what went wrong unless asked.
const (
	ServerLogLevel = "info"
	ClientLogLevel = "warn"
)

// DefaultControlAddr is where tern control listens and tern ctl looks by
// default.
const DefaultControlAddr = "127.0.0.1:12500"

// Logger builds the process logger at level (the --log-level flag), or
// at defaultLevel when level is empty; logs go to stderr so stdout stays
// for a command's own output.
func Logger(level, defaultLevel string) (*slog.Logger, error) {
	if level == "" {
		level = defaultLevel
	}
	l, err := telemetry.ParseLevel(level)
	if err != nil {
		return nil, err
	}
	return telemetry.NewLogger(os.Stderr, l), nil
}

// ClientHTTP is the HTTP client for a peer at url: with the bundle's
// client certificate when it is https.
func ClientHTTP(bundle *tlsconf.Bundle, url string) *http.Client {
	c := &http.Client{Timeout: 3 * time.Minute}
	if strings.HasPrefix(url, "https://") || url == "" {
		c.Transport = &http.Transport{TLSClientConfig: bundle.ClientConfig("")}
	}
	return c
}

// UntilDone serves h on ln until ctx ends (SIGTERM, SIGINT), then shuts
// the server down and calls closeFn.
func UntilDone(ctx context.Context, ln net.Listener, h http.Handler, bundle *tlsconf.Bundle, apiTLS bool, closeFn func()) error {
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	if apiTLS {
		hs.TLSConfig = bundle.ServerConfig()
		ln = tls.NewListener(ln, hs.TLSConfig)
	}
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	var err error
	select {
	case err = <-served:
		err = fmt.Errorf("serving the API: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	hs.Shutdown(sctx)
	closeFn()
	return err
}
