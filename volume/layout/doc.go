// Package layout is the one place that knows which volume layouts there
// are: Parse reads "replicated" or "ec:K+M", and Open builds the matching
// volume.Volume (volume/upstairs for three replicas, volume/ec for K+M
// erasure-coded shards) from one Config. The CLI, the benchmarks and the
// instance controller open volumes through it; what only one layout has
// (a replica's repair, an EC scrub) they reach by asserting the Volume to
// that layout's type.
package layout
