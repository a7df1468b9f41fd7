// Package multihost holds the control plane's real-process tests: a
// `tern control` and three `tern agent`s on the loopback addresses
// 127.0.0.2, .3 and .4 (or, as root, in network namespaces of their
// own), running the dirty guest on volumes across them. The tests on a
// three-member etcd need no KVM and live in control/quorum, so they stay
// on the host where this package moves into the emulated test host.
// Every cluster follows its agents' inventories by their long-poll and
// checks from them that no instance ever ran on two vmms at once. It is
// the control plane's one KVM test package.
package multihost
