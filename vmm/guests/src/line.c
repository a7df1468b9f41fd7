/*
 * line.c: the UART line reader of line.h.
 */
#include "line.h"

void line_init(struct line_reader *r)
{
	r->n = 0;
	r->after_cr = 0;
	r->poll_ticks = tsc_khz() * LINE_POLL_US / 1000;
}

const char *line_read(struct line_reader *r, u64 deadline)
{
	for (;;) {
		int c = uart_poll();
		if (c < 0) {
			u64 t0 = rdtsc();
			if (t0 >= deadline)
				return 0;
			while (rdtsc() - t0 < r->poll_ticks)
				__asm__ volatile("pause");
			continue;
		}
		if (c == '\n' && r->after_cr) {
			r->after_cr = 0;
			continue;
		}
		r->after_cr = c == '\r';
		if (c != '\r' && c != '\n') {
			r->buf[r->n++] = (char)c;
			if (r->n < LINE_MAX)
				continue;
		}
		r->buf[r->n] = 0;
		r->n = 0;
		return r->buf;
	}
}

int line_equals(const char *line, const char *s)
{
	for (; *line && *line == *s; line++, s++)
		;
	return *line == *s;
}
