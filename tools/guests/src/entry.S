/*
 * Entry stub of tern's test guests.
 *
 * entry64 (the ELF entry point) is where tern starts a guest: already in
 * 64-bit long mode, on page tables tern built that identity-map at least the
 * first 4 GiB. It needs nothing else from the host.
 *
 * pvh_entry32 is the PVH entry named by the XEN_ELFNOTE_PHYS32_ENTRY note,
 * used by QEMU (-M microvm -kernel): 32-bit protected mode, paging off,
 * EBX = physical address of struct hvm_start_info. It builds identity page
 * tables for the first 4 GiB with 2 MiB pages, enables PAE and long mode,
 * and joins the 64-bit path.
 *
 * Both paths end in guest_start(start_info), with start_info 0 on entry64.
 */

#define XEN_ELFNOTE_PHYS32_ENTRY 18
#define MSR_EFER 0xc0000080

	.section .note.Xen, "a", @note
	.balign 4
	.long 4				/* namesz: "Xen\0" */
	.long 4				/* descsz */
	.long XEN_ELFNOTE_PHYS32_ENTRY
	.asciz "Xen"
	.long pvh_entry32
	.balign 4

	.section .text.entry, "ax"
	.code32
	.globl pvh_entry32
pvh_entry32:
	cli
	cld
	mov	%ebx, %esi		/* keep the hvm_start_info address */
	lgdt	gdt_desc

	/* Zero the six page-table pages: PML4, PDPT and four PDs. */
	mov	$boot_pml4, %edi
	xor	%eax, %eax
	mov	$(6 * 4096 / 4), %ecx
	rep stosl

	/* PML4[0] -> PDPT; PDPT[0..3] -> PD0..PD3. */
	mov	$boot_pdpt, %eax
	or	$0x3, %eax
	mov	%eax, boot_pml4
	mov	$boot_pd, %eax
	or	$0x3, %eax
	mov	$boot_pdpt, %edi
	mov	$4, %ecx
1:	mov	%eax, (%edi)
	add	$4096, %eax
	add	$8, %edi
	loop	1b

	/* PD entries: 2048 x 2 MiB pages, present | writable | large. */
	mov	$boot_pd, %edi
	mov	$0x83, %eax
	xor	%edx, %edx
	mov	$2048, %ecx
2:	mov	%eax, (%edi)
	mov	%edx, 4(%edi)
	add	$0x200000, %eax
	adc	$0, %edx
	add	$8, %edi
	loop	2b

	mov	%cr4, %eax
	or	$0x20, %eax		/* PAE */
	mov	%eax, %cr4
	mov	$boot_pml4, %eax
	mov	%eax, %cr3
	mov	$MSR_EFER, %ecx
	rdmsr
	or	$0x100, %eax		/* LME */
	wrmsr
	mov	%cr0, %eax
	or	$0x80000001, %eax	/* PG | PE */
	mov	%eax, %cr0
	ljmp	$0x08, $from32

	.code64
from32:
	mov	$0x10, %ax
	mov	%ax, %ds
	mov	%ax, %es
	mov	%ax, %ss
	mov	%ax, %fs
	mov	%ax, %gs
	mov	%esi, %edi		/* start_info, zero-extended */
	jmp	common64

	.globl entry64
entry64:
	cli
	cld
	xor	%edi, %edi		/* no hvm_start_info on tern's entry */

common64:
	lea	boot_stack_top(%rip), %rsp
	/* Clear .bss (the stack and page tables lie outside it). */
	mov	%rdi, %rbx
	lea	__bss_start(%rip), %rdi
	lea	__bss_end(%rip), %rcx
	sub	%rdi, %rcx
	xor	%eax, %eax
	rep stosb
	mov	%rbx, %rdi
	call	guest_start
3:	hlt
	jmp	3b

	.section .rodata
	.balign 8
gdt:
	.quad 0				/* null */
	.quad 0x00af9a000000ffff	/* 0x08: 64-bit code */
	.quad 0x00cf92000000ffff	/* 0x10: data */
gdt_end:
	.balign 8
gdt_desc:
	.word gdt_end - gdt - 1
	.long gdt

	.section .boot.pagetables, "aw", @nobits
	.balign 4096
boot_pml4:	.skip 4096
boot_pdpt:	.skip 4096
boot_pd:	.skip 4 * 4096

	.section .boot.stack, "aw", @nobits
	.balign 16
	.skip 16384
boot_stack_top:

	.section .note.GNU-stack, "", @progbits
