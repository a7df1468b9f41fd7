/*
 * udp: a VM on the network, for the data-plane tests. It drives the first
 * virtio-net card (virtio_net.c) and answers UDP.
 *
 * It prints "udp: ready mac M", then polls the card for good:
 *   - a UDP datagram to port 7 is echoed: sent back with the Ethernet,
 *     IPv4 and UDP source and destination swapped (both checksums hold);
 *   - a datagram to any other port whose payload starts with a 4-byte
 *     big-endian sequence number is counted: how many arrived, how many
 *     distinct numbers below MAX_SEQ, the first and the highest number,
 *     and the longest gap between two arrivals with the highest number
 *     that had arrived when it began and the number that ended it;
 *   - from the first counted datagram on it also measures its own longest
 *     stall: the longest time between two turns of its polling loop, which
 *     is the guest's view of a live migration's downtime (the vCPU is
 *     stopped) or of the host not running it.
 *   - when the host sets the parameter block's mark word while the
 *     guest is paused (a migration's target, before it resumes) to
 *     1<<16 | the receive queue's used index then, the stall that the
 *     pause was is the marked stall, and the gap between the arrivals on
 *     either side of it the marked gap, with the highest number that had
 *     arrived before it and the number that ended it: the migration's own
 *     downtime and the gap it made, told apart from any longer stall or
 *     gap the host's scheduling made. Frames the card had received before
 *     the pause (below that used index) but the guest took in only after
 *     it (a slow guest's backlog) arrived before the pause: the gap ends
 *     at the first frame after them.
 * When the host changes the parameter block's verify_request word it
 * prints "udp: received N distinct D first F highest H gap_us G after S
 * until U stall_us T marked_stall_us MS marked_gap_us MG marked_after MA
 * marked_until MU" (the marked figures 0 with no mark), then
 * "udp: missing A-B" for each run of numbers
 * between the first and the highest (below MAX_SEQ) that never arrived,
 * at most MAX_RUNS of them and "udp: missing more" past that, then
 * "udp: end", and copies the word to verify_ack. Times are in
 * microseconds, from TSC ticks and the tsc_khz parameter.
 */
#include "virtio_net.h"

#define MAX_SEQ 65536
#define ETH_IPV4 0x0800
#define PROTO_UDP 17
#define ECHO_PORT 7
#define MAX_RUNS 16

static u8 seen[MAX_SEQ / 8];
static u8 echo_frame[FRAME_MAX];

static u16 be16(const u8 *p) { return (u16)(p[0] << 8 | p[1]); }
static u32 be32(const u8 *p) { return (u32)p[0] << 24 | (u32)p[1] << 16 | (u32)p[2] << 8 | p[3]; }

static void swap(u8 *a, u8 *b, unsigned n)
{
	for (unsigned i = 0; i < n; i++) {
		u8 t = a[i];
		a[i] = b[i];
		b[i] = t;
	}
}

static void puthexbyte(u8 b)
{
	static const char digits[] = "0123456789abcdef";
	putc(digits[b >> 4]);
	putc(digits[b & 15]);
}

/* ticks_to_us converts TSC ticks to microseconds. */
static u64 ticks_to_us(u64 ticks) { return ticks * 1000 / tsc_khz(); }

struct counts {
	u64 received, distinct, first, highest;
	u64 gap, gap_after, gap_until, stall;
	u64 last_arrival;
	/* The marked stall and gap; marked_open: the next arrival ends it. */
	u64 marked_stall, marked_gap, marked_after, marked_until, marked_from;
	int marked_open;
};

static void report(const struct counts *c)
{
	puts("udp: received ");
	putdec(c->received);
	puts(" distinct ");
	putdec(c->distinct);
	puts(" first ");
	putdec(c->first);
	puts(" highest ");
	putdec(c->highest);
	puts(" gap_us ");
	putdec(ticks_to_us(c->gap));
	puts(" after ");
	putdec(c->gap_after);
	puts(" until ");
	putdec(c->gap_until);
	puts(" stall_us ");
	putdec(ticks_to_us(c->stall));
	puts(" marked_stall_us ");
	putdec(ticks_to_us(c->marked_stall));
	puts(" marked_gap_us ");
	putdec(ticks_to_us(c->marked_gap));
	puts(" marked_after ");
	putdec(c->marked_after);
	puts(" marked_until ");
	putdec(c->marked_until);
	puts("\n");
	unsigned runs = 0;
	u64 end = c->highest < MAX_SEQ ? c->highest : MAX_SEQ - 1;
	for (u64 n = c->first; c->received > 0 && n <= end; n++) {
		if (seen[n / 8] & (1 << (n % 8)))
			continue;
		u64 last = n;
		while (last + 1 <= end && !(seen[(last + 1) / 8] & (1 << ((last + 1) % 8))))
			last++;
		if (++runs > MAX_RUNS) {
			puts("udp: missing more\n");
			break;
		}
		puts("udp: missing ");
		putdec(n);
		puts("-");
		putdec(last);
		puts("\n");
		n = last;
	}
	puts("udp: end\n");
}

/*
 * udp_payload returns the UDP payload of frame and its length and
 * destination port, or 0 when frame is not an IPv4 UDP datagram whose
 * lengths agree with the frame.
 */
static const u8 *udp_payload(const u8 *f, u32 len, u32 *plen, u16 *dport)
{
	if (len < 14 + 20 + 8 || be16(f + 12) != ETH_IPV4)
		return 0;
	const u8 *ip = f + 14;
	u32 ihl = (u32)(ip[0] & 15) * 4;
	if ((ip[0] >> 4) != 4 || ihl < 20 || ip[9] != PROTO_UDP)
		return 0;
	u32 total = be16(ip + 2);
	if (total < ihl + 8 || 14 + total > len)
		return 0;
	const u8 *udp = ip + ihl;
	u32 ulen = be16(udp + 4);
	if (ulen < 8 || ulen > total - ihl)
		return 0;
	*dport = be16(udp + 2);
	*plen = ulen - 8;
	return udp + 8;
}

static void echo(const u8 *f, u32 len)
{
	memcpy(echo_frame, f, len);
	u8 *ip = echo_frame + 14;
	u8 *udp = ip + (ip[0] & 15) * 4;
	swap(echo_frame, echo_frame + 6, 6);
	swap(ip + 12, ip + 16, 4);
	swap(udp, udp + 2, 2);
	vnet_send(echo_frame, len);
}

/*
 * count counts a numbered datagram taken in by the turn that began at
 * now; early: the card had received it before the marked pause.
 */
static void count(struct counts *c, const u8 *payload, u64 now, int early)
{
	u32 seq = be32(payload);
	if (c->received == 0) {
		c->first = seq;
	} else if (now - c->last_arrival > c->gap) {
		c->gap = now - c->last_arrival;
		c->gap_after = c->highest;
		c->gap_until = seq;
	}
	if (c->marked_open && !early) {
		c->marked_gap = now - c->marked_from;
		c->marked_until = seq;
		c->marked_open = 0;
	}
	c->received++;
	c->last_arrival = now;
	if (seq > c->highest || c->received == 1)
		c->highest = seq;
	if (seq < MAX_SEQ && !(seen[seq / 8] & (1 << (seq % 8)))) {
		seen[seq / 8] |= (u8)(1 << (seq % 8));
		c->distinct++;
	}
	if (early)
		c->marked_after = c->highest;
}

int main(void)
{
	if (!vnet_find()) {
		puts("udp: FAIL no virtio-net device\n");
		return 2;
	}
	if (!vnet_setup()) {
		puts("udp: FAIL device setup\n");
		return 2;
	}
	u8 mac[6];
	vnet_mac(mac);
	puts("udp: ready mac ");
	for (unsigned i = 0; i < 6; i++) {
		if (i)
			putc(':');
		puthexbyte(mac[i]);
	}
	puts("\n");

	volatile u64 *request = (volatile u64 *)(PARAMS_ADDR + P_VERIFY_REQUEST);
	volatile u64 *ack = (volatile u64 *)(PARAMS_ADDR + P_VERIFY_ACK);
	volatile u64 *mark = (volatile u64 *)(PARAMS_ADDR + P_MARK);
	u64 seen_mark = *mark;
	int marked_turns = 0;
	u32 backlog = 0;	/* frames received before the pause, not yet taken */
	struct counts c = { 0 };
	u64 last_turn = rdtsc();
	for (;;) {
		u64 now = rdtsc();
		u64 turn = now - last_turn;
		if (c.received > 0 && turn > c.stall)
			c.stall = turn;
		last_turn = now;
		if (*mark != seen_mark) {
			/*
			 * The pause ended in this turn, or (paused between the
			 * rdtsc and this load) ends the next: the marked stall
			 * is the longer of the two. The frames taken in so far
			 * came before the pause, and so do the rest below the
			 * used index the host wrote (the target's card may
			 * have delivered more since it resumed). A frame's
			 * time is that of the turn that took it in, so one the
			 * card delivered before the pause and the guest took
			 * in after it (a pause mostly lands in vnet_poll's
			 * notify exit) has a time before the pause.
			 */
			seen_mark = *mark;
			backlog = (u16)((u16)seen_mark - vnet_rx_taken());
			marked_turns = 2;
			c.marked_stall = 0;
			c.marked_after = c.highest;
			c.marked_from = c.last_arrival;
			c.marked_open = c.received > 0;
		}
		if (marked_turns > 0) {
			if (turn > c.marked_stall)
				c.marked_stall = turn;
			marked_turns--;
		}
		u32 len;
		const u8 *f = vnet_poll(&len);
		if (f) {
			int early = backlog > 0;
			if (early)
				backlog--;
			u32 plen;
			u16 dport;
			const u8 *p = udp_payload(f, len, &plen, &dport);
			if (p && dport == ECHO_PORT)
				echo(f, len);
			else if (p && plen >= 4)
				count(&c, p, now, early);
		}
		if (*request != *ack) {
			u64 r = *request;
			report(&c);
			*ack = r;
			last_turn = rdtsc();	/* the report's own time is no stall */
		}
	}
}
