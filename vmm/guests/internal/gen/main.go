// Command gen builds tern's test guests into vmm/guests/elf. It is run by
// `go generate ./vmm/guests` from the repository root.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	"tern/vmm/guests/internal/build"
)

func main() {
	src := flag.String("src", "src", "directory of the guest sources")
	out := flag.String("out", "elf", "directory to write the ELF files to")
	flag.Parse()
	if err := build.Build(context.Background(), *src, *out); err != nil {
		fmt.Fprintln(os.Stderr, "gen:", err)
		os.Exit(1)
	}
}
