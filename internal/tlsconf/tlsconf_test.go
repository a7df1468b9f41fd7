package tlsconf

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
)

const alpn = "tern-test-echo"

func generate(t *testing.T) (string, *Bundle) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "certs")
	if err := Generate(dir, nil, false); err != nil {
		t.Fatalf("Generate: %v", err)
	}
	b, err := Load(dir)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	return dir, b
}

// startEcho serves a QUIC echo with the given server config; each accepted
// stream is echoed back until EOF.
func startEcho(t *testing.T, conf *tls.Config) string {
	t.Helper()
	conf = conf.Clone()
	conf.NextProtos = []string{alpn}
	ln, err := quic.ListenAddr("127.0.0.1:0", conf, nil)
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			conn, err := ln.Accept(ctx)
			if err != nil {
				return
			}
			go func() {
				str, err := conn.AcceptStream(ctx)
				if err != nil {
					return
				}
				io.Copy(str, str)
				str.Close()
			}()
		}
	}()
	t.Cleanup(func() { cancel(); ln.Close(); <-done })
	return ln.Addr().String()
}

func echo(addr string, conf *tls.Config) error {
	conf = conf.Clone()
	conf.NextProtos = []string{alpn}
	// Generous: only a failing handshake waits it out.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := quic.DialAddr(ctx, addr, conf, nil)
	if err != nil {
		return err
	}
	defer conn.CloseWithError(0, "")
	str, err := conn.OpenStreamSync(ctx)
	if err != nil {
		return err
	}
	msg := []byte("hello over mutual TLS")
	if _, err := str.Write(msg); err != nil {
		return err
	}
	str.Close()
	got, err := io.ReadAll(str)
	if err != nil {
		return err
	}
	if string(got) != string(msg) {
		return errors.New("echo mismatch: " + string(got))
	}
	return nil
}

func TestMutualTLSQUICEcho(t *testing.T) {
	_, b := generate(t)
	addr := startEcho(t, b.ServerConfig())
	if err := echo(addr, b.ClientConfig("127.0.0.1")); err != nil {
		t.Fatalf("echo with the node certificate: %v", err)
	}
}

func TestClientWithoutCertificateIsRefused(t *testing.T) {
	_, b := generate(t)
	addr := startEcho(t, b.ServerConfig())
	conf := b.ClientConfig("127.0.0.1")
	conf.Certificates = nil
	err := echo(addr, conf)
	if err == nil {
		t.Fatal("a client without a certificate was served")
	}
	if !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("refusal does not say why: %v", err)
	}
}

func TestClientFromAnotherCAIsRefused(t *testing.T) {
	_, b := generate(t)
	_, other := generate(t)
	addr := startEcho(t, b.ServerConfig())
	conf := other.ClientConfig("127.0.0.1")
	conf.RootCAs = b.Roots // trust the server; present a foreign cert
	err := echo(addr, conf)
	if err == nil {
		t.Fatal("a client certificate from another CA was accepted")
	}
	if !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("refusal does not say why: %v", err)
	}
}

func TestServerFromAnotherCAIsRefusedByClient(t *testing.T) {
	_, b := generate(t)
	_, other := generate(t)
	addr := startEcho(t, other.ServerConfig())
	err := echo(addr, b.ClientConfig("127.0.0.1"))
	if err == nil || !strings.Contains(err.Error(), "certificate signed by unknown authority") {
		t.Fatalf("client accepted a foreign server or gave an unclear error: %v", err)
	}
}

func TestExpiredClientCertificateIsRefused(t *testing.T) {
	_, b := generate(t)
	// Issue an already-expired leaf under a fresh CA the server also trusts.
	ca, err := newAuthority(time.Now().Add(-48*time.Hour), 72*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	old, err := ca.issue([]string{"127.0.0.1"}, time.Now().Add(-48*time.Hour), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(old.certPEM, old.keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	serverConf := b.ServerConfig()
	serverConf.ClientCAs.AddCert(ca.cert)
	addr := startEcho(t, serverConf)
	conf := b.ClientConfig("127.0.0.1")
	conf.Certificates = []tls.Certificate{cert}
	err = echo(addr, conf)
	if err == nil {
		t.Fatal("an expired client certificate was accepted")
	}
	if !strings.Contains(err.Error(), "expired") && !strings.Contains(err.Error(), "bad certificate") {
		t.Fatalf("refusal does not say why: %v", err)
	}
}

func TestLoadRejectsExpiredNodeCertificate(t *testing.T) {
	dir := t.TempDir()
	ca, err := newAuthority(time.Now().Add(-48*time.Hour), 72*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	old, err := ca.issue(DefaultHosts, time.Now().Add(-48*time.Hour), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	err = writeAll(dir, false, map[string]pemFile{
		CAFile: {ca.certPEM, 0o644}, CAKeyFile: {ca.keyPEM, 0o600},
		NodeFile: {old.certPEM, 0o644}, NodeKeyFile: {old.keyPEM, 0o600},
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Load(dir); !errors.Is(err, ErrExpired) {
		t.Fatalf("Load of an expired node certificate: %v, want ErrExpired", err)
	}
}

func TestGenerateRefusesToOverwriteAndWritesPrivateKeys(t *testing.T) {
	dir, _ := generate(t)
	before, _ := os.ReadFile(filepath.Join(dir, CAFile))
	if err := Generate(dir, nil, false); !errors.Is(err, ErrExists) {
		t.Fatalf("second Generate: %v, want ErrExists", err)
	}
	after, _ := os.ReadFile(filepath.Join(dir, CAFile))
	if string(before) != string(after) {
		t.Fatal("refused Generate changed ca.pem")
	}
	for _, f := range []string{CAKeyFile, NodeKeyFile} {
		st, err := os.Stat(filepath.Join(dir, f))
		if err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v mode %v, want 0600", f, err, st.Mode().Perm())
		}
	}
	if err := Generate(dir, nil, true); err != nil {
		t.Fatalf("Generate with force: %v", err)
	}
	if again, _ := os.ReadFile(filepath.Join(dir, CAFile)); string(again) == string(before) {
		t.Fatal("forced Generate did not replace ca.pem")
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 4+len(Aliases) {
		t.Fatalf("directory holds %d entries, want the 4 PEM files and their %d aliases only", len(entries), len(Aliases))
	}
}

func TestGenerateWhereAFileBlocksTheDirectoryLeavesNothing(t *testing.T) {
	parent := t.TempDir()
	blocker := filepath.Join(parent, "blocker")
	if err := os.WriteFile(blocker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Generate(filepath.Join(blocker, "certs"), nil, false); err == nil {
		t.Fatal("Generate under a plain file succeeded")
	}
	entries, _ := os.ReadDir(parent)
	if len(entries) != 1 {
		t.Fatalf("failed Generate left files behind: %v", entries)
	}
}

func TestNodeCertificateCoversRequestedHosts(t *testing.T) {
	dir := t.TempDir()
	if err := Generate(dir, []string{"10.1.2.3", "node-a.example"}, false); err != nil {
		t.Fatal(err)
	}
	b, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	leaf := b.Node.Leaf
	if err := leaf.VerifyHostname("node-a.example"); err != nil {
		t.Error(err)
	}
	if err := leaf.VerifyHostname("10.1.2.3"); err != nil {
		t.Error(err)
	}
	if ip := net.ParseIP("127.0.0.1"); leaf.VerifyHostname(ip.String()) == nil {
		t.Error("leaf covers 127.0.0.1 though only other hosts were asked for")
	}
}
