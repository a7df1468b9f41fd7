// Package nettest builds the network laboratories the data-plane tests
// and `tern bench dataplane` run in: hosts as network namespaces on one
// underlay bridge, and VM stand-ins, each a network namespace with a real
// kernel stack behind a veth whose host end plays the VM's TAP (the
// device a virtio-net backend would open). Everything it makes is named
// with a random prefix, so laboratories of concurrent tests never meet,
// and Lab.Close removes all of it.
//
// It needs root and the ip command (iproute2).
package nettest
