// SPDX-License-Identifier: GPL-2.0
/*
 * tern's network data plane: two tc programs over one virtual-to-physical
 * (V2P) table.
 *
 * from_guest runs on a VM's TAP, for every frame the guest sends. ARP
 * requests for an address of the guest's own VNI are answered here with the
 * host's virtual router MAC (nothing else in the VNI ever sees the guest's
 * broadcasts). An IPv4 packet from the guest's own address is looked up by
 * (VNI of the TAP, destination): a local entry redirects it to that VM's
 * TAP, a remote one sets the tunnel key (VNI, host) and redirects it to the
 * collect-metadata VXLAN device. Everything else is dropped and counted.
 *
 * from_tunnel runs on the VXLAN device, for every decapsulated packet. The
 * tunnel's VNI and the inner destination must name a local entry whose TAP
 * is in that same VNI; then the packet goes to that TAP. An entry for a VM
 * that moved away (flag V2P_FORWARD, set for a bounded time by the loader)
 * re-encapsulates the packet toward the VM's new host, the inner TTL
 * guarding against loops. Everything else is dropped and counted.
 */
#include "tern_bpf.h"

char __license[] SEC("license") = "GPL";

/* The value's flags. */
#define V2P_FORWARD 1 /* a VM that moved away: re-encapsulate from the tunnel */

struct v2p_key {
	__u32 vni;
	__be32 ip; /* virtual IPv4, network byte order */
};

struct v2p_value {
	__u32 host;    /* the serving host's underlay IPv4, host byte order (as bpf_tunnel_key) */
	__u32 ifindex; /* the VM's TAP on this host, 0 when it is on another host */
	__u32 flags;
	__u32 pad;
};

struct port {
	__u32 vni;
	__be32 ip;         /* the guest's own address; anything else it sends is dropped */
	__u8 mac[ETH_ALEN]; /* the guest's MAC, written into frames delivered to it */
	__u16 pad;
};

enum counter {
	COUNTER_LOCAL,           /* guest to a VM on this host */
	COUNTER_ENCAPSULATED,    /* guest to a VM on another host */
	COUNTER_ARP_REPLIED,     /* ARP requests answered for the guest */
	COUNTER_DELIVERED,       /* tunnel to a VM on this host */
	COUNTER_FORWARDED,       /* tunnel to a VM that moved, re-encapsulated */
	COUNTER_DROP_NO_MAPPING, /* guest: no entry for (VNI, destination) */
	COUNTER_DROP_NOT_IPV4,   /* guest or tunnel: neither IPv4 nor ARP */
	COUNTER_DROP_ARP,        /* guest: an ARP packet not answered */
	COUNTER_DROP_SPOOFED,    /* guest: a source address not its own */
	COUNTER_DROP_NO_PORT,    /* guest: a TAP the plane does not know */
	COUNTER_DROP_MALFORMED,  /* guest or tunnel: truncated or bad header */
	COUNTER_DROP_NOT_LOCAL,  /* tunnel: (VNI, destination) is no VM here */
	COUNTER_DROP_WRONG_VNI,  /* the destination TAP is in another VNI */
	COUNTER_DROP_TTL,        /* tunnel: a forwarded packet's TTL ran out */
	COUNTER_DROP_NO_TUNNEL,  /* tunnel: no tunnel metadata */
	COUNTER_MAX,
};

/* counter_count tells the loader how many counters this object has. */
volatile const enum counter counter_count = COUNTER_MAX;

/* Set by the loader before loading. */
volatile const __u32 vxlan_ifindex;
volatile const __u8 router_mac[ETH_ALEN];

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct v2p_key);
	__type(value, struct v2p_value);
	__uint(max_entries, 65536);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} v2p SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32); /* ifindex */
	__type(value, struct port);
	__uint(max_entries, 4096);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ports SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, COUNTER_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} counters SEC(".maps");

static __always_inline int count(enum counter c, int verdict)
{
	__u32 key = c;
	__u64 *n = bpf_map_lookup_elem(&counters, &key);
	if (n)
		*n += 1; /* per-CPU: no other writer */
	return verdict;
}

static __always_inline void copy_mac(__u8 *dst, const volatile __u8 *src)
{
#pragma unroll
	for (int i = 0; i < ETH_ALEN; i++)
		dst[i] = src[i];
}

/* deliver rewrites the frame's MACs for a guest on this host and hands it to its TAP. */
static __always_inline int deliver(struct ethhdr *eth, __u32 ifindex, const struct port *dst)
{
	copy_mac(eth->h_dest, dst->mac);
	copy_mac(eth->h_source, router_mac);
	return bpf_redirect(ifindex, 0);
}

static __always_inline int encapsulate(struct __sk_buff *skb, __u32 vni, __u32 host)
{
	struct bpf_tunnel_key key = {};
	key.tunnel_id = vni;
	key.remote_ipv4 = host;
	key.tunnel_ttl = 64;
	if (bpf_skb_set_tunnel_key(skb, &key, sizeof(key), BPF_F_ZERO_CSUM_TX) < 0)
		return -1;
	return bpf_redirect(vxlan_ifindex, 0);
}

/* answer_arp turns a request for an address of the guest's VNI into the reply, in place, and sends it back. */
static __always_inline int answer_arp(struct __sk_buff *skb, const struct port *self)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct arp4 *arp = (void *)(eth + 1);
	if ((void *)(arp + 1) > data_end)
		return count(COUNTER_DROP_MALFORMED, TC_ACT_SHOT);
	if (arp->htype != bpf_htons(1) || arp->ptype != bpf_htons(ETH_P_IP) || arp->hlen != ETH_ALEN ||
	    arp->plen != 4 || arp->oper != bpf_htons(1))
		return count(COUNTER_DROP_ARP, TC_ACT_SHOT);
	struct v2p_key key = {.vni = self->vni, .ip = arp->tpa};
	if (arp->tpa == self->ip || !bpf_map_lookup_elem(&v2p, &key))
		return count(COUNTER_DROP_ARP, TC_ACT_SHOT);
	__be32 asked = arp->tpa;
	arp->oper = bpf_htons(2);
	__builtin_memcpy(arp->tha, arp->sha, ETH_ALEN);
	arp->tpa = arp->spa;
	copy_mac(arp->sha, router_mac);
	arp->spa = asked;
	__builtin_memcpy(eth->h_dest, eth->h_source, ETH_ALEN);
	copy_mac(eth->h_source, router_mac);
	count(COUNTER_ARP_REPLIED, 0);
	return bpf_redirect(skb->ifindex, 0);
}

SEC("tc")
int from_guest(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > data_end)
		return count(COUNTER_DROP_MALFORMED, TC_ACT_SHOT);
	__u32 self_ifindex = skb->ifindex;
	struct port *self = bpf_map_lookup_elem(&ports, &self_ifindex);
	if (!self)
		return count(COUNTER_DROP_NO_PORT, TC_ACT_SHOT);
	if (eth->h_proto == bpf_htons(ETH_P_ARP))
		return answer_arp(skb, self);
	if (eth->h_proto != bpf_htons(ETH_P_IP))
		return count(COUNTER_DROP_NOT_IPV4, TC_ACT_SHOT);
	struct iphdr *ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > data_end || (ip->ihl_version >> 4) != 4 || (ip->ihl_version & 0xf) < 5)
		return count(COUNTER_DROP_MALFORMED, TC_ACT_SHOT);
	if (ip->saddr != self->ip)
		return count(COUNTER_DROP_SPOOFED, TC_ACT_SHOT);
	struct v2p_key key = {.vni = self->vni, .ip = ip->daddr};
	struct v2p_value *to = bpf_map_lookup_elem(&v2p, &key);
	if (!to)
		return count(COUNTER_DROP_NO_MAPPING, TC_ACT_SHOT);
	if (to->ifindex) {
		__u32 ifindex = to->ifindex;
		struct port *dst = bpf_map_lookup_elem(&ports, &ifindex);
		if (!dst || dst->vni != self->vni)
			return count(COUNTER_DROP_WRONG_VNI, TC_ACT_SHOT);
		count(COUNTER_LOCAL, 0);
		return deliver(eth, ifindex, dst);
	}
	int verdict = encapsulate(skb, self->vni, to->host);
	if (verdict < 0)
		return count(COUNTER_DROP_MALFORMED, TC_ACT_SHOT);
	return count(COUNTER_ENCAPSULATED, verdict);
}

SEC("tc")
int from_tunnel(struct __sk_buff *skb)
{
	struct bpf_tunnel_key tunnel = {};
	if (bpf_skb_get_tunnel_key(skb, &tunnel, sizeof(tunnel), 0) < 0)
		return count(COUNTER_DROP_NO_TUNNEL, TC_ACT_SHOT);
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > data_end)
		return count(COUNTER_DROP_MALFORMED, TC_ACT_SHOT);
	if (eth->h_proto != bpf_htons(ETH_P_IP))
		return count(COUNTER_DROP_NOT_IPV4, TC_ACT_SHOT);
	struct iphdr *ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > data_end || (ip->ihl_version >> 4) != 4 || (ip->ihl_version & 0xf) < 5)
		return count(COUNTER_DROP_MALFORMED, TC_ACT_SHOT);
	struct v2p_key key = {.vni = tunnel.tunnel_id, .ip = ip->daddr};
	struct v2p_value *to = bpf_map_lookup_elem(&v2p, &key);
	if (!to)
		return count(COUNTER_DROP_NOT_LOCAL, TC_ACT_SHOT);
	if (to->ifindex) {
		__u32 ifindex = to->ifindex;
		struct port *dst = bpf_map_lookup_elem(&ports, &ifindex);
		if (!dst || dst->vni != tunnel.tunnel_id)
			return count(COUNTER_DROP_WRONG_VNI, TC_ACT_SHOT);
		count(COUNTER_DELIVERED, 0);
		return deliver(eth, ifindex, dst);
	}
	if (!(to->flags & V2P_FORWARD))
		return count(COUNTER_DROP_NOT_LOCAL, TC_ACT_SHOT);
	if (ip->ttl <= 1)
		return count(COUNTER_DROP_TTL, TC_ACT_SHOT);
	__u32 host = to->host;
	/* The TTL shares a 16-bit checksum word with the protocol. */
	__be16 old_word = *(__be16 *)&ip->ttl;
	ip->ttl -= 1;
	__be16 new_word = *(__be16 *)&ip->ttl;
	if (bpf_l3_csum_replace(skb, sizeof(struct ethhdr) + __builtin_offsetof(struct iphdr, check), old_word,
				new_word, 2) < 0)
		return count(COUNTER_DROP_MALFORMED, TC_ACT_SHOT);
	int verdict = encapsulate(skb, tunnel.tunnel_id, host);
	if (verdict < 0)
		return count(COUNTER_DROP_MALFORMED, TC_ACT_SHOT);
	return count(COUNTER_FORWARDED, verdict);
}
