/*
 * smp_cpu.S: the smp guest's CPL0 code beside entry.S's, which includes
 * it (in its .cpu section, so that the IDT's gates can name the handlers
 * below): the application processors' way from the start-up IPI to CPL3,
 * and the interrupt handlers. Layout and vectors are in smp.h.
 *
 * An application processor starts in real mode at AP_TRAMPOLINE_ADDR, the
 * start-up IPI's page, where the BSP copied ap_trampoline (it must lie
 * below 1 MiB; the image is linked at 1 MiB). The trampoline loads the
 * image's GDT, enters protected mode and jumps to ap_entry32 in the image,
 * which loads the PVH path's static page tables and enters long mode, as
 * pvh_entry32 does. ap_entry64 then loads the IDT, reads its local APIC ID
 * (its CPU number), loads its own TSS (TSS_SEL + 16 * number) and enters
 * ap_start(number) at CPL3 on its own user stack, with IF set. About 45
 * instructions at CPL0 in all.
 *
 * The interrupt handlers count and acknowledge (EOI) and return: each
 * increments its counter in its CPU's struct cpu, found at a fixed offset
 * from its stack (smp.h), so it needs no CPU number.
 *
 * The note below (name "tern", type 1, no descriptor) asks tern for the
 * in-kernel local APICs and to leave the application processors in their
 * reset state, waiting for INIT and SIPI (vmm/boot.TernNoteLocalAPICs).
 */

	.pushsection .note.tern, "a", @note
	.balign 4
	.long 5				/* namesz: "tern\0" */
	.long 0				/* descsz */
	.long 1				/* TernNoteLocalAPICs */
	.asciz "tern"
	.balign 4
	.popsection

	.code16
	.globl ap_trampoline, ap_trampoline_end
ap_trampoline:
	cli
	mov	%cs, %ax
	mov	%ax, %ds
	lgdtl	(ap_gdt_desc - ap_trampoline)
	mov	%cr0, %eax
	or	$1, %eax		/* CR0.PE */
	mov	%eax, %cr0
	ljmpl	$KERNEL_CS32, $ap_entry32
	.balign 4
ap_gdt_desc:
	.word gdt_end - gdt - 1
	.long gdt
ap_trampoline_end:

	.code32
ap_entry32:
	mov	$KERNEL_DS, %eax
	mov	%eax, %ds
	mov	%eax, %es
	mov	%eax, %ss
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
	ljmp	$KERNEL_CS, $ap_entry64

	.code64
ap_entry64:
	lgdt	gdt_desc(%rip)		/* again, for the 64-bit base */
	lidt	idt_desc(%rip)
	mov	$(LAPIC_BASE + LAPIC_ID), %eax
	mov	(%rax), %edi
	shr	$24, %edi		/* the APIC ID: this CPU's number */
	mov	%edi, %eax
	shl	$4, %eax
	add	$TSS_SEL, %eax
	ltr	%ax
	imul	$CPU_SIZE, %edi, %esi
	add	$cpus, %rsi		/* &cpus[number] */
	/*
	 * CPUID leaf 1 here, at CPL0: under nested PVM a CPUID at CPL3 runs
	 * natively and returns the host's, not what the VMM gave the vCPU.
	 */
	mov	$1, %eax
	cpuid
	mov	%ecx, (CPU_RSP0 + CPU_CPUID1_ECX)(%rsi)
	mov	%rsi, %rax
	lea	CPU_RSP0(%rax), %rsp
	lea	CPU_USER_STACK(%rax), %rcx
	push	$USER_DS		/* SS */
	push	%rcx			/* RSP */
	push	$USER_RFLAGS		/* RFLAGS */
	push	$USER_CS		/* CS */
	push	$ap_start		/* RIP; its argument is in %rdi */
	iretq

/*
 * count_irq: an interrupt from CPL3 pushed five words on rsp0, and the
 * handler one more, so the CPU's counters are 48 bytes above %rsp.
 */
	.macro count_irq counter
	push	%rax
	incq	(48 + \counter)(%rsp)
	mov	$(LAPIC_BASE + LAPIC_EOI), %eax
	movl	$0, (%rax)
	pop	%rax
	iretq
	.endm

/*
 * The timer's handler counts too; on a CPU whose timer is in TSC-deadline
 * mode (one-shot) it re-arms it first, a period (IRQ_DEADLINE ticks) after
 * the deadline it armed last, as a periodic timer keeps its schedule
 * however late its interrupt is taken; when that is past already (the
 * first interrupt, a vCPU that did not run for a period, a migration's
 * downtime) a period from now. Three words pushed: the CPU's block is 64
 * bytes above %rsp.
 */
timer_isr:
	push	%rax
	push	%rcx
	push	%rdx
	incq	(64 + IRQ_TIMER)(%rsp)
	mov	(64 + IRQ_DEADLINE)(%rsp), %rcx
	test	%rcx, %rcx
	jz	2f
	rdtsc
	shl	$32, %rdx
	or	%rdx, %rax		/* now */
	mov	(64 + IRQ_DEADLINE_NEXT)(%rsp), %rdx
	add	%rcx, %rdx		/* the next on schedule */
	cmp	%rax, %rdx
	ja	1f
	lea	(%rax, %rcx), %rdx	/* past: a period from now */
1:	mov	%rdx, (64 + IRQ_DEADLINE_NEXT)(%rsp)
	mov	%edx, %eax
	shr	$32, %rdx
	mov	$MSR_TSC_DEADLINE, %ecx
	wrmsr
2:	mov	$(LAPIC_BASE + LAPIC_EOI), %eax
	movl	$0, (%rax)
	pop	%rdx
	pop	%rcx
	pop	%rax
	iretq
ipi_isr0:
	count_irq (IRQ_IPI+0*8)
ipi_isr1:
	count_irq (IRQ_IPI+1*8)
ipi_isr2:
	count_irq (IRQ_IPI+2*8)
ipi_isr3:
	count_irq (IRQ_IPI+3*8)
spurious_isr:				/* no EOI for the spurious vector */
	iretq
