/* Fake libslowrank_cupti.so: the emit function and its uprobe semaphore, as
 * in cupti/slowrank_abi.h.
 *
 * The semaphore must live in file-backed data (PROGBITS, here ".probes" as
 * SystemTap SDT semaphores do). In .bss it works for processes that already
 * run when the uprobe is attached, but a process that loads the library later
 * gets the kernel's increment first and then ld.so's zeroing of the .bss tail
 * of the last file page: it stays 0. SEMAPHORE_IN_BSS builds that variant. */
#include "fake.h"

#ifdef SEMAPHORE_IN_BSS
volatile uint16_t slowrank_cupti_semaphore;
#else
volatile uint16_t slowrank_cupti_semaphore __attribute__((section(".probes")));
#endif

__attribute__((noinline, visibility("default"))) void slowrank_cupti_emit(const void *batch,
									  uint32_t len)
{
	__asm__ volatile("" : : "r"(batch), "r"(len) : "memory");
}

uint16_t fake_cupti_semaphore_value(void)
{
	return slowrank_cupti_semaphore;
}

/* Byte i of batch `seed` (mirrored by batchByte in the Go test). */
static unsigned char batch_byte(uint32_t seed, uint32_t i)
{
	return (unsigned char)(seed * 131u + i * 7u + (i >> 8));
}

static unsigned char buf[20000];

void fake_cupti_flush(uint32_t seed, uint32_t len)
{
	for (uint32_t i = 0; i < len && i < sizeof(buf); i++)
		buf[i] = batch_byte(seed, i);
	slowrank_cupti_emit(buf, len);
}
