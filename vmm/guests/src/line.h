/*
 * line.h: a line reader over the UART, shared by the echo and demo guests.
 *
 * A line ends at CR or LF (CR LF counts once); a line longer than
 * LINE_MAX bytes is returned in pieces of LINE_MAX. Each poll of an empty
 * UART is an exit to the VMM, so between polls the reader spins on the
 * TSC for LINE_POLL_US microseconds (natively, at CPL3).
 */
#ifndef TERN_LINE_H
#define TERN_LINE_H

#include "guest.h"

#define LINE_MAX 128
#define LINE_POLL_US 50

struct line_reader {
	char buf[LINE_MAX + 1];	/* the line being read, NUL-terminated when returned */
	unsigned n;		/* bytes in buf */
	int after_cr;		/* the last byte was CR: a LF next ends no line */
	u64 poll_ticks;		/* TSC ticks between polls of an empty UART */
};

/* line_init prepares r for reading. */
void line_init(struct line_reader *r);

/*
 * line_read polls the UART until it completes a line or the TSC reaches
 * deadline (~0 never). It returns the line, without its end, in r's
 * buffer (valid until the next call), or 0 at the deadline; a partial
 * line is kept for the next call.
 */
const char *line_read(struct line_reader *r, u64 deadline);

/* line_equals reports whether line is s. */
int line_equals(const char *line, const char *s);

#endif
