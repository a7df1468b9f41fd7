package telemetry

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/VictoriaMetrics/metrics"
)

func TestLoggerWritesJSONWithComponent(t *testing.T) {
	var buf bytes.Buffer
	l := Component(NewLogger(&buf, slog.LevelInfo), "downstairs")
	l.Debug("hidden")
	l.Info("listening", "addr", "127.0.0.1:1")
	var line map[string]any
	if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
		t.Fatalf("log line %q is not one JSON object: %v", buf.String(), err)
	}
	if line["component"] != "downstairs" || line["msg"] != "listening" {
		t.Fatalf("log line = %v", line)
	}
}

func TestParseLevel(t *testing.T) {
	for in, want := range map[string]slog.Level{"debug": slog.LevelDebug, "INFO": slog.LevelInfo, "warn": slog.LevelWarn, "error": slog.LevelError} {
		if got, err := ParseLevel(in); err != nil || got != want {
			t.Errorf("ParseLevel(%q) = %v, %v", in, got, err)
		}
	}
	if _, err := ParseLevel("loud"); err == nil {
		t.Error("ParseLevel(loud) succeeded")
	}
}

func TestServeMetricsExposesSet(t *testing.T) {
	set := metrics.NewSet()
	set.NewCounter(`tern_test_total{kind="write"}`).Add(3)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := ServeMetrics(ln, set)
	defer s.Close()
	resp, err := http.Get("http://" + ln.Addr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), `tern_test_total{kind="write"} 3`) {
		t.Fatalf("metrics body lacks the counter:\n%s", body)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
}
