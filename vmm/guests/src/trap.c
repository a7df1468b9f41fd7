/*
 * trap.c: the exception handler, entered at CPL0 from entry.S's stubs for
 * vectors 0-31. Exceptions are fatal in the test guests: it prints one
 * line on the UART and exits with status EXCEPTION_STATUS_BASE + vector.
 *
 * The one exception that is not an error is exit()'s hlt at CPL3 (a #GP on
 * a hlt instruction): the exit port did not end the VM, so the guest halts
 * here for good.
 *
 * With trap_triple_fault set (hello's hello_fault 6), the handler instead
 * loads an empty IDT and faults again at CPL0: the #UD finds no gate, nor
 * does the #GP that follows, nor the #DF after it, and the CPU shuts down
 * (a triple fault, KVM_EXIT_SHUTDOWN), which is what the VMM's crash report
 * is tested with.
 */
#include "guest.h"

#define EXCEPTION_STATUS_BASE 0x40

/* struct trap_frame is the stack trap_common hands over. */
struct trap_frame {
	u64 vector, error;
	u64 rip, cs, rflags, rsp, ss;	/* pushed by the CPU */
};

void trap(struct trap_frame *f) __attribute__((noreturn));

volatile u8 trap_triple_fault;

static __attribute__((noreturn)) void triple_fault(void)
{
	static const struct {
		u16 limit;
		u64 base;
	} __attribute__((packed)) no_idt = { 0, 0 };

	__asm__ volatile("lidt %0; ud2" : : "m"(no_idt));
	for (;;)
		;
}

static const char *const names[32] = {
	"#DE", "#DB", "NMI", "#BP", "#OF", "#BR", "#UD", "#NM",
	"#DF", "#MF", "#TS", "#NP", "#SS", "#GP", "#PF", "#15",
	"#MF", "#AC", "#MC", "#XM", "#VE", "#CP", "#22", "#23",
	"#24", "#25", "#26", "#27", "#HV", "#VC", "#SX", "#31",
};

static __attribute__((noreturn)) void halt(void)
{
	for (;;)
		__asm__ volatile("cli; hlt");
}

void trap(struct trap_frame *f)
{
	if (trap_triple_fault)
		triple_fault();
	if (f->vector == 13 && (f->cs & 3) == 3 && *(const volatile u8 *)f->rip == 0xf4)
		halt();	/* exit()'s hlt */
	puts("guest: exception ");
	puts(names[f->vector & 31]);
	puts(" vector ");
	putdec(f->vector);
	puts(" error ");
	puthex(f->error);
	puts(" rip ");
	puthex(f->rip);
	puts(" cpl ");
	putdec(f->cs & 3);
	if (f->vector == 14) {
		u64 cr2;
		__asm__ volatile("mov %%cr2, %0" : "=r"(cr2));
		puts(" cr2 ");
		puthex(cr2);
	}
	puts("\n");
	outb(DEBUG_EXIT_PORT, (u8)(EXCEPTION_STATUS_BASE + f->vector));
	halt();
}
