// Package quorum holds the control plane's tests against a three-member
// etcd: two `tern control` processes on it, one leading and one
// forwarding; the leader SIGKILLed; one and then two members killed and
// brought back. They need no KVM, so they run on the host even where the
// KVM packages move into the emulated test host.
package quorum
