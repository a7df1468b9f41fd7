// Package planebench is the data plane's benchmark behind `tern bench
// dataplane`: two hosts as network namespaces on an underlay bridge, a VM
// stand-in on each, UDP round trips and throughput through the eBPF data
// plane beside the same over a plain routed veth path (the limit), in one
// run. It is apart from package bench so that only the tern-bench binary,
// not every process that links a benchmark's types, links the eBPF
// loader.
package planebench
