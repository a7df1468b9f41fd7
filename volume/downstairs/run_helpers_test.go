package downstairs

import (
	"log/slog"
	"runtime"
	"strings"
	"testing"
	"time"

	"tern/internal/tlsconf"
)

func tlsGenerate(dir string) error { return tlsconf.Generate(dir, []string{"127.0.0.1"}, false) }

func tlsLoad(t testing.TB, dir string) *tlsconf.Bundle {
	t.Helper()
	b, err := tlsconf.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func jsonLogger(w *syncBuffer) *slog.Logger { return slog.New(slog.NewJSONHandler(w, nil)) }

// waitListening waits for Run's "listening" record and returns its addr.
func waitListening(t testing.TB, logs *syncBuffer) string {
	t.Helper()
	deadline := time.Now().Add(testTimeout)
	for time.Now().Before(deadline) {
		if strings.Contains(logs.String(), `"msg":"listening"`) {
			for _, r := range logRecords(logs.String()) {
				if r["msg"] == "listening" {
					return r["addr"].(string)
				}
			}
		}
		runtime.Gosched()
	}
	t.Fatal("no listening log")
	return ""
}
