package sim

import (
	"os"
	"strings"
	"testing"
)

// TestDumpTrace writes the full trace of -seed to $SIM_DUMP (debugging aid).
func TestDumpTrace(t *testing.T) {
	path := os.Getenv("SIM_DUMP")
	if path == "" || *flagSeed < 0 {
		t.Skip("set SIM_DUMP and -seed")
	}
	cfg := configFor(t, uint64(*flagSeed))
	cfg.KeepTrace = true
	res := Run(cfg)
	os.WriteFile(path, []byte(strings.Join(res.Trace, "\n")+"\n"), 0o644)
	t.Log(res.Summary(), res.Violations)
}
