package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"tern/instance/apiv1"
	"tern/instance/client"
	"tern/internal/child"
	"tern/internal/tlsconf"
	"tern/migration"
)

// The tests of `tern migrate` that need no guest: the version check
// happens before anything is ensured. The migrations themselves, which
// boot guests, are in ./migratetest (it enters the emulated test host
// where /dev/kvm does not work).

// startServe runs `tern vmm serve` on a free loopback port with env
// added, and returns its URL; it is stopped at the end of the test.
func startServe(t *testing.T, certs string, env ...string) string {
	t.Helper()
	cmd := exec.Command(ternBin, "vmm", "serve", "--listen", "127.0.0.1:0", "--certs", certs)
	cmd.Env = append(os.Environ(), env...)
	// Read only once Start failed, when the child was reaped (and Wait
	// has finished copying into it).
	var stderr strings.Builder
	cmd.Stderr = &stderr
	p, url, err := child.Start(cmd, child.Options{Ready: child.Ready{Match: child.ListeningURL, Wait: time.Minute, What: "its URL"}})
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	t.Cleanup(p.Kill)
	return url
}

func TestMigrateRefusesAProtocolMismatchBeforeEnsuringTheTarget(t *testing.T) {
	certs := filepath.Join(t.TempDir(), "certs")
	if err := tlsconf.Generate(certs, nil, false); err != nil {
		t.Fatal(err)
	}
	src := startServe(t, certs)
	dst := startServe(t, certs, "TERN_MIGRATION_PROTOCOLS=99")
	// host:port for --to, as every command that names a vmm takes it.
	stdout, stderr, code := runTern(t, "migrate", "--from", src, "--to", strings.TrimPrefix(dst, "http://"))
	if code == 0 {
		t.Fatalf("tern migrate to a vmm speaking only protocol 99 exited 0; stdout %q", stdout)
	}
	for _, want := range []string{"no common migration protocol", fmt.Sprint(migration.SupportedVersions), "[99]"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr %q lacks %q", stderr, want)
		}
	}
	c, err := client.New(dst, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := c.Get(ctx); !client.IsCode(err, apiv1.CodeNoInstance) {
		t.Errorf("the target after a refused migration: GET /v1/instance = %v; want %s", err, apiv1.CodeNoInstance)
	}
}

func TestMigrateNeedsFromAndTo(t *testing.T) {
	_, stderr, code := runTern(t, "migrate", "--from", "127.0.0.1:1")
	if code == 0 || !strings.Contains(stderr, "--from and --to are required") {
		t.Fatalf("exit %d, stderr %q; want a non-zero exit naming --from and --to", code, stderr)
	}
}

// TestBenchMigrateRefusesInsideTheEmulatedTestHost runs tern bench
// migrate as the emulated test host's init would run it: it exits 1,
// saying why.
func TestBenchMigrateRefusesInsideTheEmulatedTestHost(t *testing.T) {
	wantBenchRefusedInside(t, "bench", "migrate", "--sizes", "256", "--rates", "10")
}

func TestParseSerialMigratedTo(t *testing.T) {
	for _, c := range []struct {
		msg  string
		want string
		ok   bool
	}{
		{`{"migrated_to":"http://127.0.0.1:4000"}`, "http://127.0.0.1:4000", true},
		{`{"migrated_to":"127.0.0.1:4000"}`, "127.0.0.1:4000", true},
		{`{"migrated_to":""}`, "", false},
		{`{"migrated_to":"ftp://x"}`, "", false},
		{`{"other":"http://127.0.0.1:4000"}`, "", false},
		{`not json`, "", false},
	} {
		got, ok := parseSerialMigratedTo([]byte(c.msg))
		if got != c.want || ok != c.ok {
			t.Errorf("parseSerialMigratedTo(%q) = %q, %v; want %q, %v", c.msg, got, ok, c.want, c.ok)
		}
	}
}

func FuzzParseSerialMigratedTo(f *testing.F) {
	f.Add([]byte(`{"migrated_to":"http://127.0.0.1:4000"}`))
	f.Add([]byte(`{"migrated_to":"http://[::1"}`))
	f.Fuzz(func(t *testing.T, msg []byte) {
		if u, ok := parseSerialMigratedTo(msg); ok {
			if _, err := client.New(u, nil); err != nil {
				t.Fatalf("accepted %q, which the client cannot use: %v", u, err)
			}
		}
	})
}
