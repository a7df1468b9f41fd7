/*
 * hello: writes the boot timer, prints one line and exits with 0.
 *
 * The boot timer marks the moment the guest's program starts, as an init
 * process's first write does under Firecracker: the line that follows costs
 * two UART exits per byte and is output, not boot.
 *
 * With the hello_fault parameter it then raises an exception on purpose,
 * to prove the exception handler: 1 #DE (divide by zero), 2 #UD (ud2),
 * 3 #GP (a non-canonical address), 4 #PF (a read of unmapped
 * 0x100000000), 5 #GP (a port the IO bitmap does not allow), 6 a triple
 * fault (a ud2 whose handler loads an empty IDT and faults again: trap.c).
 */
#include "guest.h"

static void fault(u64 which)
{
	volatile u64 zero = 0, sink;
	u64 lo = 1, hi = 0;

	switch (which) {
	case 1:
		__asm__ volatile("divq %2" : "+a"(lo), "+d"(hi) : "r"(zero));
		break;
	case 2:
		__asm__ volatile("ud2");
		break;
	case 3:
		sink = *(volatile u64 *)0x8000000000000000ULL;
		break;
	case 4:
		sink = *(volatile u64 *)0x100000000ULL;
		break;
	case 5:
		outb(0x80, 0);
		break;
	case 6:
		trap_triple_fault = 1;
		__asm__ volatile("ud2");
		break;
	}
	(void)sink;
	puts("hello: unknown hello_fault ");
	putdec(which);
	puts("\n");
}

int main(void)
{
	mmio_write8(BOOT_TIMER_ADDR, BOOT_TIMER_MAGIC);
	puts("Hello from the tern test guest\n");
	u64 which = param(P_HELLO_FAULT, 0);
	if (which) {
		fault(which);
		return 3;
	}
	return 0;
}
