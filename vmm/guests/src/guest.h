/*
 * guest.h: the small runtime shared by tern's test guests: port IO, the
 * 8250 UART at 0x3f8, the boot timer, the TSC, the debug-exit port and the
 * parameter block.
 *
 * Everything declared here runs at CPL3 (user mode), where main() runs:
 * entry.S sets up at CPL0 and drops to user mode before guest_start. Port
 * IO works at CPL3 only for the ports the TSS's IO-permission bitmap
 * allows (the UART's 0x3f8-0x3ff and the exit port 0xf4); any other port
 * raises #GP, which the exception handler (trap.c) reports.
 */
#ifndef TERN_GUEST_H
#define TERN_GUEST_H

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef unsigned long uptr;

#define UART_BASE 0x3f8
#define DEBUG_EXIT_PORT 0xf4
#define BOOT_TIMER_ADDR 0xC0000000UL
#define BOOT_TIMER_MAGIC 123

/*
 * The parameter block: the host may write it at guest-physical PARAMS_ADDR
 * before the guest starts. It is used only when magic equals PARAMS_MAGIC
 * ("TERNPARM" little-endian) and version equals PARAMS_VERSION; a zero
 * field means "use the default". All fields are little-endian u64.
 */
#define PARAMS_ADDR 0x8000UL
#define PARAMS_MAGIC 0x4d5241504e524554ULL
#define PARAMS_VERSION 1

struct params {
	u64 magic;		/* 0x00 PARAMS_MAGIC */
	u64 version;		/* 0x08 PARAMS_VERSION */
	u64 mem_start;		/* 0x10 dirty: first byte of the patterned area */
	u64 mem_bytes;		/* 0x18 dirty: size of the patterned area */
	u64 working_set_bytes;	/* 0x20 dirty: bytes rewritten each pass */
	u64 passes;		/* 0x28 dirty: rewrite passes; ~0 = forever */
	u64 page_delay_tsc;	/* 0x30 dirty: TSC ticks to wait per page */
	u64 seed;		/* 0x38 disk, demo: pattern seed */
	u64 sectors;		/* 0x40 disk: sectors to verify; demo: per round */
	u64 virtio_base;	/* 0x48 disk, demo: virtio-mmio base; 0 = scan */
	u64 tsc_khz;		/* 0x50 TSC frequency; 0 = DEFAULT_TSC_KHZ */
	u64 verify_request;	/* 0x58 dirty: host changes it to ask for a verify */
	u64 verify_ack;		/* 0x60 dirty: guest copies the request here after */
	u64 verify_every_sec;	/* 0x68 dirty: seconds between verifications (1) */
	u64 hello_fault;	/* 0x70 hello: raise an exception on purpose */
	u64 idle;		/* 0x78 dirty: 1 = fill once, then dirty nothing */
	u64 mark;		/* 0x80 udp: 1<<16 | rx used index, set while paused */
	u64 vcpus;		/* 0x88 smp: the VM's vCPUs (1) */
	u64 ap_hold;		/* 0x90 smp: hold the APs' start until ap_go */
	u64 ap_go;		/* 0x98 smp: the host sets it to release the hold */
};

/* Parameter offsets, as param() takes them. */
#define P_MEM_START 0x10
#define P_MEM_BYTES 0x18
#define P_WORKING_SET 0x20
#define P_PASSES 0x28
#define P_PAGE_DELAY 0x30
#define P_SEED 0x38
#define P_SECTORS 0x40
#define P_VIRTIO_BASE 0x48
#define P_TSC_KHZ 0x50
#define P_VERIFY_REQUEST 0x58
#define P_VERIFY_ACK 0x60
#define P_VERIFY_EVERY_SEC 0x68
#define P_HELLO_FAULT 0x70
#define P_IDLE 0x78
#define P_MARK 0x80
#define P_VCPUS 0x88
#define P_AP_HOLD 0x90
#define P_AP_GO 0x98

/*
 * DEFAULT_TSC_KHZ is the TSC frequency assumed without a tsc_khz
 * parameter; it only scales the figures the guests print and the dirty
 * guest's verification interval.
 */
#define DEFAULT_TSC_KHZ 2000000ULL

/* trap_triple_fault makes the exception handler triple-fault (trap.c). */
extern volatile u8 trap_triple_fault;

/* param returns field v of the parameter block, or def when absent. */
u64 param(unsigned offset, u64 def);

static inline void outb(u16 port, u8 v) { __asm__ volatile("outb %0, %1" : : "a"(v), "Nd"(port)); }
static inline u8 inb(u16 port) { u8 v; __asm__ volatile("inb %1, %0" : "=a"(v) : "Nd"(port)); return v; }
static inline u64 rdtsc(void) { u32 lo, hi; __asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi)); return ((u64)hi << 32) | lo; }
static inline void mmio_write8(uptr a, u8 v) { *(volatile u8 *)a = v; }
static inline void mmio_write32(uptr a, u32 v) { *(volatile u32 *)a = v; }
static inline u32 mmio_read32(uptr a) { return *(volatile u32 *)a; }
static inline void barrier(void) { __asm__ volatile("mfence" ::: "memory"); }

void putc(char c);
int uart_poll(void);		/* the next input byte, or -1 when none */
void puts(const char *s);	/* no newline added */
void putdec(u64 v);
void puthex(u64 v);
void exit(u8 status) __attribute__((noreturn));
u64 tsc_khz(void);		/* the tsc_khz parameter, or DEFAULT_TSC_KHZ */
u64 ticks_to_ms(u64 ticks);

void *memset(void *d, int c, unsigned long n);
void *memcpy(void *d, const void *s, unsigned long n);

/* main is each guest's body; its return value is the exit status. */
int main(void);

#endif
