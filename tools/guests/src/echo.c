/*
 * echo: reads lines from the UART and echoes each back.
 *
 * It prints "echo: ready", then polls the UART (LSR bit 0 at 0x3fd, data
 * at 0x3f8) and for each line it receives prints "echo: <line>". A line
 * ends at CR or LF (CR LF counts once); lines longer than LINE_MAX bytes
 * are echoed in pieces. The line "quit" makes it print "echo: bye" and exit
 * with 0.
 *
 * Each poll of an empty UART is an exit to the VMM, so between polls it
 * spins on the TSC for POLL_US microseconds (natively, at CPL3).
 */
#include "guest.h"

#define LINE_MAX 128
#define POLL_US 50

static int is_quit(const char *s)
{
	return s[0] == 'q' && s[1] == 'u' && s[2] == 'i' && s[3] == 't' && s[4] == 0;
}

int main(void)
{
	char line[LINE_MAX + 1];
	unsigned n = 0;
	int after_cr = 0;
	u64 poll_ticks = tsc_khz() * POLL_US / 1000;

	puts("echo: ready\n");
	for (;;) {
		int c = uart_poll();
		if (c < 0) {
			for (u64 t0 = rdtsc(); rdtsc() - t0 < poll_ticks;)
				__asm__ volatile("pause");
			continue;
		}
		if (c == '\n' && after_cr) {
			after_cr = 0;
			continue;
		}
		after_cr = c == '\r';
		if (c != '\r' && c != '\n') {
			line[n++] = (char)c;
			if (n < LINE_MAX)
				continue;
		}
		line[n] = 0;
		n = 0;
		puts("echo: ");
		puts(line);
		puts("\n");
		if (is_quit(line)) {
			puts("echo: bye\n");
			return 0;
		}
	}
}
