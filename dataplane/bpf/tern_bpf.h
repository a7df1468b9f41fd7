/*
 * tern_bpf.h: the few kernel ABI definitions and helper declarations the
 * data-plane programs use, so they build with clang alone (no kernel or
 * libbpf headers). Every value here is fixed kernel UAPI: helper numbers,
 * the __sk_buff context layout up to the fields read, bpf_tunnel_key.
 */
#ifndef TERN_BPF_H
#define TERN_BPF_H

typedef unsigned char __u8;
typedef unsigned short __u16;
typedef unsigned int __u32;
typedef unsigned long long __u64;
typedef __u16 __be16;
typedef __u32 __be32;

#define SEC(name) __attribute__((section(name), used))
#define __always_inline inline __attribute__((always_inline))

/* BTF-defined maps, the layout cilium/ebpf (and libbpf) read. */
#define __uint(name, val) int(*name)[val]
#define __type(name, val) typeof(val) *name

enum {
	BPF_MAP_TYPE_HASH = 1,
	BPF_MAP_TYPE_PERCPU_ARRAY = 6,
};

enum {
	LIBBPF_PIN_BY_NAME = 1,
};

/* tc actions (linux/pkt_cls.h). */
#define TC_ACT_OK 0
#define TC_ACT_SHOT 2

/* bpf_skb_set_tunnel_key flags. */
#define BPF_F_ZERO_CSUM_TX (1ULL << 1)

/* The __sk_buff context, up to data_end (the fields after it are unused). */
struct __sk_buff {
	__u32 len;
	__u32 pkt_type;
	__u32 mark;
	__u32 queue_mapping;
	__u32 protocol;
	__u32 vlan_present;
	__u32 vlan_tci;
	__u32 vlan_proto;
	__u32 priority;
	__u32 ingress_ifindex;
	__u32 ifindex;
	__u32 tc_index;
	__u32 cb[5];
	__u32 hash;
	__u32 tc_classid;
	__u32 data;
	__u32 data_end;
};

struct bpf_tunnel_key {
	__u32 tunnel_id;
	union {
		__u32 remote_ipv4;
		__u32 remote_ipv6[4];
	};
	__u8 tunnel_tos;
	__u8 tunnel_ttl;
	__u16 tunnel_ext;
	__u32 tunnel_label;
	union {
		__u32 local_ipv4;
		__u32 local_ipv6[4];
	};
};

/* Helpers, by their fixed numbers (enum bpf_func_id). */
static void *(*bpf_map_lookup_elem)(void *map, const void *key) = (void *)1;
static long (*bpf_l3_csum_replace)(struct __sk_buff *skb, __u32 offset, __u64 from, __u64 to, __u64 size) = (void *)10;
static long (*bpf_skb_get_tunnel_key)(struct __sk_buff *skb, struct bpf_tunnel_key *key, __u32 size, __u64 flags) = (void *)20;
static long (*bpf_skb_set_tunnel_key)(struct __sk_buff *skb, struct bpf_tunnel_key *key, __u32 size, __u64 flags) = (void *)21;
static long (*bpf_redirect)(__u32 ifindex, __u64 flags) = (void *)23;

/* Wire formats (the programs run little-endian: bpfel only). */
#define bpf_htons(x) ((__be16)__builtin_bswap16(x))
#define bpf_htonl(x) ((__be32)__builtin_bswap32(x))

#define ETH_P_IP 0x0800
#define ETH_P_ARP 0x0806
#define ETH_ALEN 6

struct ethhdr {
	__u8 h_dest[ETH_ALEN];
	__u8 h_source[ETH_ALEN];
	__be16 h_proto;
} __attribute__((packed));

struct iphdr {
	__u8 ihl_version; /* ihl in the low nibble, version in the high */
	__u8 tos;
	__be16 tot_len;
	__be16 id;
	__be16 frag_off;
	__u8 ttl;
	__u8 protocol;
	__u16 check;
	__be32 saddr;
	__be32 daddr;
} __attribute__((packed));

/* An Ethernet/IPv4 ARP packet after its Ethernet header. */
struct arp4 {
	__be16 htype;
	__be16 ptype;
	__u8 hlen;
	__u8 plen;
	__be16 oper;
	__u8 sha[ETH_ALEN];
	__be32 spa;
	__u8 tha[ETH_ALEN];
	__be32 tpa;
} __attribute__((packed));

#endif
