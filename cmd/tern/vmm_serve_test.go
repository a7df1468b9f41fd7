package main

import (
	"slices"
	"testing"

	"tern/cmd/internal/serve"
	"tern/instance/apiv1"
)

// TestMigrationProtocolsHook reads TERN_MIGRATION_PROTOCOLS: unset is the
// engine's own list, a list replaces it, and anything else is refused.
func TestMigrationProtocolsHook(t *testing.T) {
	for _, tc := range []struct {
		env  string
		want []apiv1.MigrationVersion
		ok   bool
	}{
		{"", nil, true},
		{"99", []apiv1.MigrationVersion{99}, true},
		{"1, 7", []apiv1.MigrationVersion{1, 7}, true},
		{"0", nil, false},
		{"x", nil, false},
		{"70000", nil, false},
	} {
		t.Setenv(serve.MigrationProtocolsEnv, tc.env)
		got, err := serve.MigrationProtocols()
		if (err == nil) != tc.ok || !slices.Equal(got, tc.want) {
			t.Errorf("%s=%q: %v, %v; want %v (ok %v)", serve.MigrationProtocolsEnv, tc.env, got, err, tc.want, tc.ok)
		}
	}
}
