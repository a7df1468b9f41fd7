// Package chaos runs tern's volume against real `tern downstairs`
// processes under faults: replicas on separate network hosts whose links
// are impaired and cut, a seeded SIGKILL crash campaign, and a soak that
// watches resources for leaks. docs/reliability.md lists each campaign,
// its command and what it found.
//
// # Network hosts
//
// NewNetwork makes one network namespace per host (by convention "up"
// for the upstairs, "ds0".."ds2" for the replicas), each with one veth,
// eth0, at 10.213.0.N/24, the other ends on a bridge in a switch
// namespace of its own: the subnet exists only inside the namespaces, so
// nothing reaches the root namespace or beyond. Replicas run as real
// processes through `ip netns exec` (which execs, so the PID we hold is
// tern's own and SIGKILL reaches it).
//
// The upstairs runs in the test process, not in a namespace: entering a
// namespace is per OS thread and the upstairs dials from goroutines on
// any thread. Instead its only way onto the network is a Proxy per
// replica: the upstairs dials the proxy on 127.0.0.1, and the proxy's
// sockets towards the replica are created inside the upstairs host's
// namespace (Host.ListenUDP: setns on a locked thread for the socket
// call alone, the thread discarded if it cannot switch back). So every
// datagram of the volume leaves through the upstairs host's eth0, crosses
// the bridge and enters the replica host's eth0, where cuts apply.
//
// This kernel has no netem (CONFIG_NET_SCH_NETEM is off, no modules),
// nor the matchall classifier or gact action, so:
//
//   - delay, jitter, loss, reordering and duplication come from the
//     Proxy, both directions, drawn by Impairment.Decide (pure, seeded,
//     fuzzed);
//   - cuts are tc-bpf filters in direct-action mode on a host's eth0
//     (clsact ingress for Inbound, egress for Outbound), running the
//     classic BPF program "ret #2" (TC_ACT_SHOT): no nftables needed.
//
// Where namespaces cannot be made (not root, no ip or tc, no clsact or
// cls_bpf) NewNetwork's error wraps ErrNotSupported saying which, and the
// tests skip with it; CI runs as root and must not skip them.
//
// # Workload and invariants
//
// A Workload writes versioned patterns (upstairs.FillPattern keyed by a
// per-write version) from lanes: one sequential writer per disjoint range
// of blocks, so a block's versions are totally ordered and a read must
// return the latest acknowledged one. Per block it remembers the
// acknowledged versions, the latest one covered by an acknowledged flush
// (submitted after the write's acknowledgement) and the versions whose
// write failed. Verify classifies every block: OK (latest acknowledged,
// or a failed later one), Stale (an older acknowledged version still
// after the flushed one), Lost (older than the flushed one) or Corrupt
// (nothing ever written). Cluster.CompareRegions then reads the three
// stopped regions block by block: converged replicas hold the same bytes.
//
// # Crash campaign and soak
//
// RunCrashCampaign kills one, two or all three replicas with SIGKILL at
// seeded moments (counted in acknowledged writes, not time), restarts
// them, waits until all are Active, and finally repairs (activation at a
// higher generation), verifies and compares regions. RunSoak loops
// start/IO/kill/restart/verify/close and samples goroutines, fds, UDP
// sockets (one per QUIC connection dialled) and RSS of this process and
// the replicas; Trend says whether a figure keeps growing.
package chaos
