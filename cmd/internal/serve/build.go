package serve

import (
	"fmt"
	"os"
	"runtime/debug"
	"strconv"
	"strings"

	"tern/instance/apiv1"
)

// BuildVersion reads the module version and, when the build recorded
// them, the VCS revision, time and dirty flag.
func BuildVersion() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "tern (unknown version)"
	}
	s := "tern " + info.Main.Version
	var rev, when, modified string
	for _, kv := range info.Settings {
		switch kv.Key {
		case "vcs.revision":
			rev = kv.Value
		case "vcs.time":
			when = kv.Value
		case "vcs.modified":
			modified = kv.Value
		}
	}
	if rev != "" {
		s += " revision " + rev
		if modified == "true" {
			s += "-dirty"
		}
		if when != "" {
			s += " (" + when + ")"
		}
	}
	return s + " " + info.GoVersion
}

// MigrationProtocolsEnv is a test hook: a comma-separated list of
// migration protocol versions this process offers and reports instead of
// migration.SupportedVersions, so that a version mismatch can be produced
// between two real processes (TERN_MIGRATION_PROTOCOLS=99).
const MigrationProtocolsEnv = "TERN_MIGRATION_PROTOCOLS"

// MigrationProtocols reads MigrationProtocolsEnv; nil when unset.
func MigrationProtocols() ([]apiv1.MigrationVersion, error) {
	v := os.Getenv(MigrationProtocolsEnv)
	if v == "" {
		return nil, nil
	}
	var out []apiv1.MigrationVersion
	for f := range strings.SplitSeq(v, ",") {
		n, err := strconv.ParseUint(strings.TrimSpace(f), 10, 16)
		if err != nil || n == 0 {
			return nil, fmt.Errorf("%s=%q: want comma-separated protocol versions from 1 to 65535", MigrationProtocolsEnv, v)
		}
		out = append(out, apiv1.MigrationVersion(n))
	}
	return out, nil
}
