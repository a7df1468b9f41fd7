// Package multihost holds the control plane's real-process tests: a
// `tern control` and three `tern agent`s on the loopback addresses
// 127.0.0.2, .3 and .4, running the dirty guest on volumes across them.
// It is the control plane's one KVM test package.
package multihost
