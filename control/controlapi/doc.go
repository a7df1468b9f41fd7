// Package controlapi is the control plane's contract as plain types: the
// records it keeps in etcd and serves (hosts, instances, their volumes and
// regions, vmms, migrations, V2P mappings), the views `tern ctl` shows,
// and the bodies of its requests (create, migrate, drain). It imports
// nothing of tern but the instance contract (instance/apiv1) and id types,
// so `tern ctl`, `tern up --hosts` and tests speak to the control plane
// without linking it, and with it etcd, gRPC and protobuf: those are in
// the tern-control binary alone.
package controlapi
