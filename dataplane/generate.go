package dataplane

// The programs are compiled by clang into v2p_bpfel.o, embedded by the
// generated v2p_bpfel.go; both are committed, so building tern needs no
// clang. CLANG records the compiler that made them (CI regenerates and
// compares byte for byte when it has the same one).
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -go-package dataplane -target bpfel -type v2p_key -type v2p_value -type port v2p bpf/v2p.c -- -O2 -g -Wall -Werror -nostdinc -I./bpf
//go:generate sh -c "clang --version | head -1 > bpf/CLANG"
