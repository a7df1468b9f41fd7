// Command tern-agent is the host agent: `tern agent` runs it (the tern binary finds
// it beside itself, on PATH, or builds it from its source tree). It is a
// binary of its own so that the eBPF loader and netlink it links are in
// the one process per host that runs the data plane, not in every vmm,
// downstairs and CLI process (docs/ARCHITECTURE.md, "Processes").
package main

import (
	"tern/cmd/internal/serve"
)

var logLevel string

func main() {
	root := serve.NewRoot("tern's host agent (run as tern agent)", serve.ServerLogLevel, &logLevel)
	root.AddCommand(newAgentCmd())
	serve.Main(root, "tern")
}
