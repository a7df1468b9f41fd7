package main

func init() {
	rootCmd.AddCommand(siblingCommand(
		"agent --listen ADDR --data-dir DIR --certs DIR [--control URL] [--cpus N --memory SIZE]",
		"Run a host's agent: its vmm and downstairs processes, inventory and reports",
		`Serve the host agent API on --listen (tern agent --help lists the flags).`,
		"tern-agent", agentBinaryEnv, func(args []string) []string { return append([]string{"agent"}, args...) }))
}

// agentBinaryEnv names the tern-agent binary tern agent runs.
const agentBinaryEnv = "TERN_AGENT_BIN"
