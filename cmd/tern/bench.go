package main

func init() {
	rootCmd.AddCommand(siblingCommand("bench",
		"Measure tern beside the limits of this machine (volume IO, repair, boot, migration, data plane)",
		`The benchmarks and simulation campaigns (tern bench --help lists them).`,
		"tern-bench", "TERN_BENCH_BIN", func(args []string) []string { return append([]string{"bench"}, args...) }))
}
