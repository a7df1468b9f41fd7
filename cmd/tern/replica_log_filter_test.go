package main

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

func TestReplicaLogFilterPassesEachReplicaWarningOnceAndAllElse(t *testing.T) {
	var buf bytes.Buffer
	f := newReplicaLogFilter(slog.NewTextHandler(&buf, nil))
	log := slog.New(f).With("component", "upstairs") // derived handlers share what was seen
	for range 3 {
		log.Warn("downstairs session ended", "replica", 1, "err", "dial: timeout")
		log.Warn("downstairs session ended", "replica", 2, "err", "dial: timeout")
		log.Warn("no replica named", "n", 1)
	}
	log.Info("replica state", "replica", 1, "state", "active")
	log.Info("replica state", "replica", 1, "state", "stopped")
	f.quiet(0)
	log.Warn("downstairs session ended", "replica", 0)
	log.Error("replica refused to rejoin", "replica", 0)
	log.Error("replica refused to rejoin", "replica", 0)
	got := buf.String()
	for msg, want := range map[string]int{
		"downstairs session ended\" component=upstairs replica=1": 1, "replica=2": 1, `msg="replica state"`: 2, `"no replica named"`: 3,
		`msg="downstairs session ended" component=upstairs replica=0`: 0, `msg="replica refused to rejoin"`: 2,
	} {
		if n := strings.Count(got, msg); n != want {
			t.Errorf("%d lines with %s, want %d; log:\n%s", n, msg, want, got)
		}
	}
}
