//go:build ignore

/*
 * slowrank_cupti.c — a fake libslowrank_cupti.so (slowrank's own CUPTI
 * injection library, cupti/): only its batch ABI towards the agent, the emit
 * function and its uprobe semaphore of cupti/slowrank_abi.h, with batches of
 * known bytes, for bpf/'s probe tests. Not built into $(OUT_DIR)/fakelibs
 * itself (see fakelibs.mk: a bare dlopen name must never find it there).
 *
 * The semaphore must live in file-backed data (PROGBITS, here ".probes" as
 * SystemTap SDT semaphores do). In .bss it works for processes that already
 * run when the uprobe is attached, but a process that loads the library later
 * gets the kernel's increment first and then ld.so's zeroing of the .bss tail
 * of the last file page: it stays 0. -DSEMAPHORE_IN_BSS builds that variant
 * (bss/libslowrank_cupti.so), which the agent must warn about.
 */
#include <stdint.h>

#define SC_API __attribute__((visibility("default")))

SC_API void slowrank_cupti_emit(const void *batch, uint32_t len);
SC_API uint16_t slowrank_fake_cupti_semaphore(void);
SC_API void slowrank_fake_cupti_flush(uint32_t seed, uint32_t len);

#ifdef SEMAPHORE_IN_BSS
SC_API volatile uint16_t slowrank_cupti_semaphore;
#else
SC_API volatile uint16_t slowrank_cupti_semaphore __attribute__((section(".probes")));
#endif

/* The probed function: the batch is what BPF copies into the ring buffer. */
__attribute__((noinline)) void slowrank_cupti_emit(const void *batch, uint32_t len) {
  __asm__ volatile("" : : "r"(batch), "r"(len) : "memory");
}

/* The semaphore as this process sees it (the kernel bumps it per uprobe). */
uint16_t slowrank_fake_cupti_semaphore(void) { return slowrank_cupti_semaphore; }

/* Byte i of batch `seed` (mirrored by batchByte in bpf/uprobe_test.go). */
static unsigned char batch_byte(uint32_t seed, uint32_t i) { return (unsigned char)(seed * 131u + i * 7u + (i >> 8)); }

static unsigned char buf[20000];

/* Emits batch `seed` of len bytes (len may exceed what BPF accepts). */
void slowrank_fake_cupti_flush(uint32_t seed, uint32_t len) {
  for (uint32_t i = 0; i < len && i < sizeof(buf); i++) buf[i] = batch_byte(seed, i);
  slowrank_cupti_emit(buf, len);
}
