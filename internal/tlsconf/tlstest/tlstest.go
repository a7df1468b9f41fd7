// Package tlstest gives tests a CA and a certificate for 127.0.0.1, made
// by tlsconf as `tern certs` makes them, in a directory of the test's own.
package tlstest

import (
	"os"
	"sync"
	"testing"

	"tern/internal/tlsconf"
)

// Loopback makes the CA and a certificate for 127.0.0.1 and loads them.
func Loopback(t testing.TB) *tlsconf.Bundle {
	t.Helper()
	dir := t.TempDir()
	if err := tlsconf.Generate(dir, []string{"127.0.0.1"}, false); err != nil {
		t.Fatal(err)
	}
	b, err := tlsconf.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

var shared struct {
	once   sync.Once
	bundle *tlsconf.Bundle
	err    error
}

// Shared is Loopback made once per test binary and shared by all its
// tests, for packages whose many tests each need a CA (generating keys
// is the slow part). Its files are removed once loaded.
func Shared(t testing.TB) *tlsconf.Bundle {
	t.Helper()
	shared.once.Do(func() {
		dir, err := os.MkdirTemp("", "tern-tlstest-")
		if err != nil {
			shared.err = err
			return
		}
		defer os.RemoveAll(dir)
		if shared.err = tlsconf.Generate(dir, []string{"127.0.0.1"}, false); shared.err == nil {
			shared.bundle, shared.err = tlsconf.Load(dir)
		}
	})
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	return shared.bundle
}
