package guests

import (
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strings"
)

//go:embed elf/*.elf
var elfFiles embed.FS

// ErrUnknownGuest reports a name that is not one of the built-in guests.
var ErrUnknownGuest = errors.New("unknown guest")

// Names returns the names of the built-in guests, sorted.
func Names() []string {
	entries, err := fs.ReadDir(elfFiles, "elf")
	if err != nil {
		panic("guests: embedded directory missing: " + err.Error()) // broken build
	}
	var names []string
	for _, e := range entries {
		if n, ok := strings.CutSuffix(e.Name(), ".elf"); ok {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	return names
}

// ELF returns the ELF file of the named built-in guest. The slice is a
// fresh copy the caller may modify.
func ELF(name string) ([]byte, error) {
	if name == "" || strings.ContainsAny(name, "/.") {
		return nil, fmt.Errorf("%w %q", ErrUnknownGuest, name)
	}
	b, err := elfFiles.ReadFile("elf/" + name + ".elf")
	if err != nil {
		return nil, fmt.Errorf("%w %q (built-in guests: %s)", ErrUnknownGuest, name, strings.Join(Names(), ", "))
	}
	return b, nil
}
