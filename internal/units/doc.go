// Package units parses the sizes that tern's flags and specs accept: plain
// byte counts or binary multiples with a KiB, MiB, GiB or TiB suffix
// ("4096", "64MiB", "1GiB"). Durations use Go's syntax (time.ParseDuration)
// and need no parser of their own.
//
// It lives under internal/ because every layer's flags and specs use it
// and nothing outside the module should (docs/ARCHITECTURE.md).
package units
