package client_test

import (
	"slices"
	"testing"

	"tern/internal/tlsconf"
	"tern/migration"
	"tern/volume/transport"
)

// TestVersionAndMigrationEndpoint: GET /v1/version reports the build and
// what the migration engine speaks, and GET /v1/instance reports a
// migration endpoint that takes QUIC with mutual TLS from the same CA.
func TestVersionAndMigrationEndpoint(t *testing.T) {
	p := startVMM(t, "")
	c, ctx := p.client, ctx(t)
	ver, err := c.Version(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ver.Build == "" || !slices.Equal(ver.MigrationProtocols, migration.SupportedVersions) {
		t.Fatalf("GET /v1/version = %+v; want a build and protocols %v", ver, migration.SupportedVersions)
	}
	for kind, want := range migration.DeviceVersions() {
		if !slices.Equal(ver.Devices[kind], want) {
			t.Errorf("devices[%s] = %v; want %v", kind, ver.Devices[kind], want)
		}
	}
	if _, err := c.Ensure(ctx, echoSpec("endpoint")); err != nil {
		t.Fatal(err)
	}
	v, err := c.Get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if v.MigrationAddr == "" {
		t.Fatal("GET /v1/instance has no migration_addr")
	}
	b, err := tlsconf.Load(p.certs)
	if err != nil {
		t.Fatal(err)
	}
	conf := b.ClientConfig("127.0.0.1")
	conf.NextProtos = []string{migration.NextProto}
	conn, err := transport.Dial(ctx, v.MigrationAddr, conf)
	if err != nil {
		t.Fatalf("dialing migration_addr %s: %v", v.MigrationAddr, err)
	}
	conn.CloseWithError(0, "")
}
