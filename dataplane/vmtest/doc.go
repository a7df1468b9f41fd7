// Package vmtest holds the data plane's tests with real VMs: tern's udp
// guest on a virtio-net card whose TAP is a data-plane port, live-migrated
// between two hosts' namespaces while the mapping moves. It has no code
// but its tests; it is the one place under dataplane/ that may import the
// VMM and migration (internal/layering), so the data plane itself keeps
// knowing only programs, maps and devices.
//
// Its tests need root and KVM: where /dev/kvm is unusable kvmtest runs
// them in the emulated test host (two CPUs: the udp guest polls its card
// and keeps one busy), whose kvmhost loads the vxlan, sch_ingress and
// cls_bpf modules the planes need.
package vmtest
