/*
 * Entry stub of tern's test guests: the CPL0 set-up, and the exception
 * handlers.
 *
 * Under nested PVM every instruction a guest runs at CPL0 is emulated in
 * software (about 0.7 M instructions/s) while CPL3 code runs natively, so
 * the CPL0 part is kept to a few instructions: the GDT, the TSS with its
 * IO-permission bitmap, the IDT and the PVH path's page tables are all
 * static data, complete at link time. The set-up only loads them and
 * enters CPL3 with iretq; the C start-up (guest_start, runtime.c) and
 * main() run in user mode.
 *
 * entry64 (the ELF entry point) is where tern starts a guest: already in
 * 64-bit long mode, on page tables tern built that identity-map at least the
 * first 4 GiB with U/S set at every level. It needs nothing else.
 *
 * pvh_entry32 is the PVH entry named by the XEN_ELFNOTE_PHYS32_ENTRY note,
 * used by QEMU (-M microvm -kernel): 32-bit protected mode, paging off,
 * EBX = physical address of struct hvm_start_info. It loads the static
 * identity page tables below (4 GiB, 2 MiB pages, U/S set), enables PAE and
 * long mode, and joins entry64's path.
 *
 * Both paths end in guest_start(start_info) at CPL3, start_info 0 on
 * entry64.
 */

#define XEN_ELFNOTE_PHYS32_ENTRY 18
#define MSR_EFER 0xc0000080

/* The image is linked here (link.ld asserts it of image_base). */
#define IMAGE_BASE 0x100000
/*
 * ABS(x) is the link-time address of x, a label in this section, as an
 * assembler constant: unlike the bare symbol, it can be split into the
 * bit fields of a descriptor or a gate.
 */
#define ABS(x) (IMAGE_BASE + (x) - image_base)

#define KERNEL_CS 0x08
#define KERNEL_DS 0x10
#define USER_DS 0x1b
#define USER_CS 0x23
#define TSS_SEL 0x28

/*
 * The smp guest (smp_entry.S defines SMP_GUEST and includes this file)
 * takes interrupts at CPL3 and gives each CPU its own TSS and stacks
 * (smp.h, smp_cpu.S): its BSP's TSS points into cpus[0], and CPL3 runs
 * with IF set. Every other guest assembles to the same bytes as without
 * it.
 */
#ifdef SMP_GUEST
#include "smp.h"
#define KERNEL_CS32 0x68
#define USER_RFLAGS 0x202		/* IF=1, IOPL=0 */
#define TSS_RSP0 (cpus + CPU_RSP0)
#define TSS_IST1 (cpus + CPU_DF_STACK_TOP)
#else
#define USER_RFLAGS 2			/* IF=0, IOPL=0 */
#define TSS_RSP0 kernel_stack_top
#define TSS_IST1 double_fault_stack_top
#endif

	.section .note.Xen, "a", @note
	.balign 4
	.long 4				/* namesz: "Xen\0" */
	.long 4				/* descsz */
	.long XEN_ELFNOTE_PHYS32_ENTRY
	.asciz "Xen"
	.long pvh_entry32
	.balign 4

	/*
	 * One section for the CPL0 code and every table that names an
	 * address in it, so that ABS() resolves in the assembler.
	 */
	.section .cpu, "awx", @progbits
	.globl image_base
image_base:
	.code32
	.globl pvh_entry32
pvh_entry32:
	mov	%ebx, %edi		/* start_info, for guest_start */
	lgdt	gdt_desc		/* reads the low 32 bits of the base */
	mov	$0x20, %eax		/* CR4.PAE */
	mov	%eax, %cr4
	mov	$pvh_pml4, %eax
	mov	%eax, %cr3
	mov	$MSR_EFER, %ecx
	mov	$0x100, %eax		/* EFER.LME */
	xor	%edx, %edx
	wrmsr
	mov	$0x80000011, %eax	/* CR0.PG | ET | PE */
	mov	%eax, %cr0
	ljmp	$KERNEL_CS, $cpl0_setup

	.code64
	.globl entry64
entry64:
	xor	%edi, %edi		/* no hvm_start_info on tern's entry */
cpl0_setup:
	lgdt	gdt_desc(%rip)
	lidt	idt_desc(%rip)
	mov	$TSS_SEL, %eax
	ltr	%ax
	lea	kernel_stack_top(%rip), %rsp
	push	$USER_DS		/* SS */
	push	$user_stack_top		/* RSP */
	push	$USER_RFLAGS		/* RFLAGS */
	push	$USER_CS		/* CS */
	push	$guest_start		/* RIP */
	iretq

/*
 * Exception stubs: each pushes a zero error code where the CPU pushes none,
 * then its vector, so trap() sees one frame layout.
 */
	.macro isr vector, has_error
isr\vector:
	.if !\has_error
	push	$0
	.endif
	push	$\vector
	jmp	trap_common
	.endm

	isr 0, 0;  isr 1, 0;  isr 2, 0;  isr 3, 0
	isr 4, 0;  isr 5, 0;  isr 6, 0;  isr 7, 0
	isr 8, 1;  isr 9, 0;  isr 10, 1; isr 11, 1
	isr 12, 1; isr 13, 1; isr 14, 1; isr 15, 0
	isr 16, 0; isr 17, 1; isr 18, 0; isr 19, 0
	isr 20, 0; isr 21, 1; isr 22, 0; isr 23, 0
	isr 24, 0; isr 25, 0; isr 26, 0; isr 27, 0
	isr 28, 0; isr 29, 1; isr 30, 1; isr 31, 0

trap_common:
	cld
	mov	%rsp, %rdi		/* struct trap_frame * */
	and	$-16, %rsp
	call	trap			/* does not return */
1:	cli
	hlt
	jmp	1b

#ifdef SMP_GUEST
#include "smp_cpu.S"
#endif

/*
 * The GDT: the selectors PVM needs for native user mode (user data 0x1b,
 * 64-bit user code 0x23) and a 64-bit TSS. Accessed bits are preset so
 * that loading a segment does not write the table.
 */
	.balign 16
gdt:
	.quad 0				/* null */
	.quad 0x00af9b000000ffff	/* 0x08: kernel code, 64-bit */
	.quad 0x00cf93000000ffff	/* 0x10: kernel data */
	.quad 0x00cff3000000ffff	/* 0x18: user data, DPL 3 */
	.quad 0x00affb000000ffff	/* 0x20: user code, 64-bit, DPL 3 */
	/* 0x28: 64-bit TSS, available (type 9), present */
	.macro tss_desc base
	.quad ((tss_end - tss - 1) & 0xffff) | ((ABS(\base) & 0xffffff) << 16) | (0x89 << 40) | (((tss_end - tss - 1) >> 16) << 48) | ((ABS(\base) >> 24) << 56)
	.quad 0				/* TSS base bits 63:32 */
	.endm
	tss_desc tss
#ifdef SMP_GUEST
	tss_desc tss1			/* 0x38: CPU 1's */
	tss_desc tss2			/* 0x48: CPU 2's */
	tss_desc tss3			/* 0x58: CPU 3's */
	.quad 0x00cf9b000000ffff	/* 0x68: kernel code, 32-bit */
#endif
gdt_end:

	.balign 8
gdt_desc:
	.word gdt_end - gdt - 1
	.quad gdt

/*
 * The 64-bit TSS: rsp0 is the stack exceptions from CPL3 run on, IST1 the
 * one #DF runs on. Its IO-permission bitmap (bit clear = allowed) covers
 * ports 0-0x3ff and allows only the exit port 0xf4 and the UART's eight
 * ports 0x3f8-0x3ff; every other port, and any above the bitmap, raises #GP
 * at CPL3. The bitmap ends with the 0xff byte the architecture wants.
 */
	.macro tss_body rsp0, ist1
0:	.long 0
	.quad \rsp0			/* 0x04 rsp0 */
	.quad 0, 0			/* 0x0c rsp1, rsp2 */
	.quad 0				/* 0x1c reserved */
	.quad \ist1			/* 0x24 ist1 */
	.quad 0, 0, 0, 0, 0, 0		/* 0x2c ist2-ist7 */
	.quad 0				/* 0x5c reserved */
	.word 0				/* 0x64 reserved */
	.word 1f - 0b			/* 0x66 IO-permission bitmap offset */
1:	.fill 0xf4 / 8, 1, 0xff
	.byte 0xff & ~(1 << (0xf4 % 8))	/* 0xf0-0xf7: allow 0xf4 */
	.fill 0x3f8 / 8 - 0xf4 / 8 - 1, 1, 0xff
	.byte 0x00			/* 0x3f8-0x3ff: the UART */
	.byte 0xff			/* end of the bitmap */
	.endm

	.balign 16
tss:
	tss_body TSS_RSP0, TSS_IST1
tss_end:
#ifdef SMP_GUEST
	/* The application processors' TSSs, each on its own struct cpu. */
	.balign 16
tss1:	tss_body (cpus+1*CPU_SIZE+CPU_RSP0), (cpus+1*CPU_SIZE+CPU_DF_STACK_TOP)
	.balign 16
tss2:	tss_body (cpus+2*CPU_SIZE+CPU_RSP0), (cpus+2*CPU_SIZE+CPU_DF_STACK_TOP)
	.balign 16
tss3:	tss_body (cpus+3*CPU_SIZE+CPU_RSP0), (cpus+3*CPU_SIZE+CPU_DF_STACK_TOP)
#endif

/* The IDT: interrupt gates for the 32 exception vectors, #DF on IST1. */
	.macro gate_to handler, ist
	.word ABS(\handler) & 0xffff
	.word KERNEL_CS
	.byte \ist
	.byte 0x8e			/* present, DPL 0, 64-bit interrupt gate */
	.word ABS(\handler) >> 16
	.long 0				/* handler bits 63:32 */
	.long 0
	.endm
	.macro gate vector, ist
	gate_to isr\vector, \ist
	.endm

	.balign 16
idt:
	gate 0, 0;  gate 1, 0;  gate 2, 0;  gate 3, 0
	gate 4, 0;  gate 5, 0;  gate 6, 0;  gate 7, 0
	gate 8, 1;  gate 9, 0;  gate 10, 0; gate 11, 0
	gate 12, 0; gate 13, 0; gate 14, 0; gate 15, 0
	gate 16, 0; gate 17, 0; gate 18, 0; gate 19, 0
	gate 20, 0; gate 21, 0; gate 22, 0; gate 23, 0
	gate 24, 0; gate 25, 0; gate 26, 0; gate 27, 0
	gate 28, 0; gate 29, 0; gate 30, 0; gate 31, 0
#ifdef SMP_GUEST
	/* Not present up to each handler: such a vector raises #NP. */
	.fill (VEC_TIMER - 32) * 16, 1, 0
	gate_to timer_isr, 0
	.fill (VEC_IPI - VEC_TIMER - 1) * 16, 1, 0
	gate_to ipi_isr0, 0; gate_to ipi_isr1, 0; gate_to ipi_isr2, 0; gate_to ipi_isr3, 0
	.fill (VEC_SPURIOUS - VEC_IPI - SMP_MAX_CPUS) * 16, 1, 0
	gate_to spurious_isr, 0
#endif
idt_end:

	.balign 8
idt_desc:
	.word idt_end - idt - 1
	.quad idt

/*
 * The PVH path's identity page tables: PML4 -> PDPT -> four page
 * directories of 2 MiB pages for the first 4 GiB (RAM and the MMIO below
 * 4 GiB), all present, writable and user (U/S) so that CPL3 reaches
 * everything. Static, so the 32-bit set-up runs no loop.
 */
#define PTE_P_RW_US 0x7
#define PTE_PS 0x80
	.section .boot.pagetables, "aw", @progbits
	.balign 4096
pvh_pml4:
	.quad pvh_pdpt + PTE_P_RW_US
	.fill 511, 8, 0
pvh_pdpt:
	.quad pvh_pd + 0 * 4096 + PTE_P_RW_US
	.quad pvh_pd + 1 * 4096 + PTE_P_RW_US
	.quad pvh_pd + 2 * 4096 + PTE_P_RW_US
	.quad pvh_pd + 3 * 4096 + PTE_P_RW_US
	.fill 508, 8, 0
pvh_pd:
	.set page, 0
	.rept 2048
	.quad (page << 21) | PTE_PS | PTE_P_RW_US
	.set page, page + 1
	.endr

/* Stacks, outside .bss: they are in use before and while it is cleared. */
	.section .boot.stack, "aw", @nobits
	.balign 16
	.skip 16384
user_stack_top:
	.skip 4096
kernel_stack_top:
	.skip 4096
double_fault_stack_top:

	.section .note.GNU-stack, "", @progbits
