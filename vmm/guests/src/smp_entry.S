/*
 * smp_entry.S: the smp guest's entry: entry.S with its SMP parts (see
 * there and smp_cpu.S).
 */
#define SMP_GUEST 1
#include "entry.S"
