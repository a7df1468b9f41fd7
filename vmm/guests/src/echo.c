/*
 * echo: reads lines from the UART and echoes each back.
 *
 * It prints "echo: ready", then for each line it receives (line.h: CR, LF
 * or CR LF ends one; lines over LINE_MAX bytes come in pieces) prints
 * "echo: <line>". The line "quit" makes it print "echo: bye" and exit with
 * 0.
 */
#include "line.h"

int main(void)
{
	struct line_reader r;

	line_init(&r);
	puts("echo: ready\n");
	for (;;) {
		const char *line = line_read(&r, ~0ULL);
		puts("echo: ");
		puts(line);
		puts("\n");
		if (line_equals(line, "quit")) {
			puts("echo: bye\n");
			return 0;
		}
	}
}
