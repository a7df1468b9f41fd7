package main

func init() {
	rootCmd.AddCommand(siblingCommand(
		"control --listen ADDR --data-dir DIR --certs DIR [--etcd-endpoints URLS]",
		"Run the control plane: records in etcd, placement, migration sagas, drain",
		`Serve the control-plane API on --listen (tern control --help lists the
flags).`,
		"tern-control", controlBinaryEnv, func(args []string) []string { return args }))
}

// controlBinaryEnv names the tern-control binary tern control runs.
const controlBinaryEnv = "TERN_CONTROL_BIN"
