/*
 * runtime.c: the shared runtime of tern's test guests (see guest.h). It
 * runs at CPL3, entered from entry.S with iretq.
 */
#include "guest.h"

void guest_start(uptr start_info) __attribute__((noreturn));

extern u64 __bss_start[], __bss_end[];

static void uart_init(void)
{
	outb(UART_BASE + 1, 0x00);	/* IER: no interrupts */
	outb(UART_BASE + 3, 0x80);	/* LCR: DLAB on */
	outb(UART_BASE + 0, 0x01);	/* DLL: 115200 baud */
	outb(UART_BASE + 1, 0x00);	/* DLM */
	outb(UART_BASE + 3, 0x03);	/* LCR: 8N1, DLAB off */
	outb(UART_BASE + 2, 0x00);	/* FCR: FIFO off */
	outb(UART_BASE + 4, 0x03);	/* MCR: DTR | RTS */
}

void putc(char c)
{
	int spin = 100000;
	while (!(inb(UART_BASE + 5) & 0x20) && --spin)	/* LSR.THRE */
		;
	outb(UART_BASE, (u8)c);
}

int uart_poll(void)
{
	if (!(inb(UART_BASE + 5) & 0x01))	/* LSR.DR */
		return -1;
	return inb(UART_BASE);
}

void puts(const char *s)
{
	for (; *s; s++) {
		if (*s == '\n')
			putc('\r');
		putc(*s);
	}
}

void putdec(u64 v)
{
	char buf[21];
	int i = 20;
	buf[i] = 0;
	do {
		buf[--i] = (char)('0' + v % 10);
		v /= 10;
	} while (v);
	puts(buf + i);
}

void puthex(u64 v)
{
	static const char digits[] = "0123456789abcdef";
	char buf[19];
	int i = 18;
	buf[i] = 0;
	do {
		buf[--i] = digits[v & 15];
		v >>= 4;
	} while (v);
	buf[--i] = 'x';
	buf[--i] = '0';
	puts(buf + i);
}

/*
 * exit writes the status to the exit port, which normally ends the VM. If
 * it does not, hlt (privileged) faults into trap(), which recognises it and
 * halts at CPL0.
 */
void exit(u8 status)
{
	outb(DEBUG_EXIT_PORT, status);
	for (;;)
		__asm__ volatile("hlt");
}

u64 tsc_khz(void)
{
	return param(P_TSC_KHZ, DEFAULT_TSC_KHZ);
}

u64 ticks_to_ms(u64 ticks)
{
	return ticks / tsc_khz();
}

u64 param(unsigned offset, u64 def)
{
	const volatile u64 *p = (const volatile u64 *)PARAMS_ADDR;
	if (p[0] != PARAMS_MAGIC || p[1] != PARAMS_VERSION)
		return def;
	u64 v = p[offset / 8];
	return v ? v : def;
}

void *memset(void *d, int c, unsigned long n)
{
	u8 *p = d;
	while (n--)
		*p++ = (u8)c;
	return d;
}

void *memcpy(void *d, const void *s, unsigned long n)
{
	u8 *p = d;
	const u8 *q = s;
	while (n--)
		*p++ = *q++;
	return d;
}

void guest_start(uptr start_info)
{
	(void)start_info;
	for (u64 *p = __bss_start; p < __bss_end; p++)
		*(volatile u64 *)p = 0;
	uart_init();
	exit((u8)main());
}
