package main

func init() {
	rootCmd.AddCommand(siblingCommand(
		"agent --listen ADDR --data-dir DIR --certs DIR [--control URL] [--cpus N --memory SIZE]",
		"Run a host's agent: its vmm and downstairs processes, inventory and reports",
		`Serve the host agent API on --listen (tern agent --help lists the flags).`,
		"tern-agent", "TERN_AGENT_BIN", func(args []string) []string { return append([]string{"agent"}, args...) }))
}
