package bench

import (
	"context"
	"encoding/json"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParseQMPMessage(t *testing.T) {
	for _, c := range []struct {
		line, kind string
		ok         bool
	}{
		{`{"QMP": {"version": {}, "capabilities": []}}`, "greeting", true},
		{`{"return": {}}`, "return", true},
		{`{"error": {"class": "CommandNotFound", "desc": "no"}}`, "error", true},
		{`{"event": "STOP", "timestamp": {"seconds": 1, "microseconds": 2}}`, "event", true},
		{`{"return": {}, "event": "STOP"}`, "", false},
		{`{}`, "", false},
		{`[1]`, "", false},
		{`{"return": `, "", false},
	} {
		m, err := parseQMPMessage([]byte(c.line))
		if (err == nil) != c.ok {
			t.Errorf("parseQMPMessage(%s): %v; want ok %v", c.line, err, c.ok)
			continue
		}
		if !c.ok {
			continue
		}
		got := map[bool]string{m.QMP != nil: "greeting", m.Return != nil: "return", m.Error != nil: "error", m.Event != "": "event"}[true]
		if got != c.kind {
			t.Errorf("parseQMPMessage(%s) is a %s; want %s", c.line, got, c.kind)
		}
	}
}

func FuzzParseQMPMessage(f *testing.F) {
	f.Add([]byte(`{"QMP": {"version": {}}}`))
	f.Add([]byte(`{"return": {"status": "completed", "total-time": 12, "downtime": 3}}`))
	f.Add([]byte(`{"error": {"class": "GenericError", "desc": "x"}}`))
	f.Fuzz(func(t *testing.T, line []byte) {
		m, err := parseQMPMessage(line)
		if err != nil {
			return
		}
		if m.Return != nil {
			var st qemuMigrationStatus
			_ = json.Unmarshal(m.Return, &st)
		}
	})
}

// TestQMPClientTalksToQEMU runs a real QEMU with no machine that connects
// its QMP to the test: the greeting, a command's answer and a command's
// error come through the client.
func TestQMPClientTalksToQEMU(t *testing.T) {
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		t.Skip("qemu-system-x86_64 not installed (apt-get install qemu-system-x86)")
	}
	sock := filepath.Join(t.TempDir(), "qmp")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, qemu, "-M", "none", "-nodefaults", "-display", "none", "-qmp", "unix:"+sock)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cancel(); cmd.Wait() }()
	conn, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	q, err := newQMPClient(conn, time.Minute)
	if err != nil {
		t.Fatalf("%v; qemu stderr: %s", err, stderr.String())
	}
	defer q.close()
	var st struct {
		Status string `json:"status"`
	}
	if err := q.execute("query-status", nil, &st); err != nil || st.Status == "" {
		t.Fatalf("query-status: %+v, %v; want a status", st, err)
	}
	var mig qemuMigrationStatus
	if err := q.execute("query-migrate", nil, &mig); err != nil || mig.Status != "" {
		t.Fatalf("query-migrate before any migration: %+v, %v; want no status", mig, err)
	}
	if err := q.execute("no-such-command", nil, nil); err == nil || !strings.Contains(err.Error(), "CommandNotFound") {
		t.Fatalf("an unknown command: %v; want QEMU's CommandNotFound", err)
	}
}
