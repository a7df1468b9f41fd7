/* hello: prints one line, writes the boot timer and exits with 0. */
#include "guest.h"

int main(void)
{
	puts("Hello from the tern test guest\n");
	mmio_write8(BOOT_TIMER_ADDR, BOOT_TIMER_MAGIC);
	return 0;
}
