// Command tern-bench holds the benchmarks and simulation campaigns:
// `tern bench …` runs it (the tern binary finds it beside itself, on
// PATH, or builds it from its source tree). It is a binary of its own so
// that the scenarios, the simulator (with its test-only switches in the
// decision cores), the fault campaigns and the data plane's benchmark are
// linked into no vmm, downstairs or CLI process (docs/ARCHITECTURE.md,
// "Processes"). It starts the tern binary that ran it for the processes
// it measures.
package main

import (
	"tern/cmd/internal/serve"
)

var logLevel string

func main() {
	root := serve.NewRoot("tern's benchmarks (run as tern bench …)", serve.ClientLogLevel, &logLevel)
	root.AddCommand(newBenchCmd())
	serve.Main(root, "tern")
}
