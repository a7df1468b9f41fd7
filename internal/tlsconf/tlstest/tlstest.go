// Package tlstest gives tests a CA and a certificate for 127.0.0.1, made
// by tlsconf as `tern certs` makes them, in a directory of the test's own.
package tlstest

import (
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
