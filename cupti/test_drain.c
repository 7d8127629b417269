//go:build ignore

/*
 * test_drain.c - records of work still queued on the GPU when device
 * collection switches off are delivered once that work has run, not lost;
 * against the fake libcupti (test/fakelibs/cupti.c, CUPTI's contract: a
 * record's slot is taken at launch, its timestamps written when it ends, a
 * forced flush returns incomplete records without timestamps).
 *
 * On a GPU-bound job the host queues kernels a step or more ahead of the GPU:
 * when the duty cycle turns collection off, the records of those kernels are
 * still incomplete. The library takes its buffers back by normal flushes
 * until every one has completed, and by force only SR_DRAIN_MAX_NS after the
 * disable (a buffer that never completes).
 *
 *   queued   kernels that end 0.2-1.2 s after the disable: every one reaches
 *            the library with timestamps, none is dropped
 *   hung     a kernel that never ends within the drain: after ~3 s the
 *            library takes its buffer back by force (one record dropped,
 *            counted) and CUPTI holds no buffer of the library's
 *
 * Usage: test_drain LIB FAKE_CUPTI
 */
#define _GNU_SOURCE
#include "slowrank_abi.h"
#include "test_clock.h"

#include "../test/fakelibs/fakecupti.h"

#include <cupti.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define FAIL(...)                                      \
	do {                                           \
		fprintf(stderr, "FAIL: " __VA_ARGS__); \
		fprintf(stderr, "\n");                 \
		exit(1);                               \
	} while (0)

static fakecupti_launch_fn launch;
static fakecupti_counters_fn counters;
static struct slowrank_cupti_control *ctl;
static uint32_t gen;

#define ST(field, v) __atomic_store_n(&ctl->field, (v), __ATOMIC_RELEASE)
#define LD(field) __atomic_load_n(&ctl->field, __ATOMIC_ACQUIRE)

static void *sym(void *h, const char *name)
{
	void *p = dlsym(h, name);
	if (!p)
		FAIL("missing symbol %s", name);
	return p;
}

/* The agent's duty write with the seqlock (an even generation is applied). */
static void duty(uint32_t mode)
{
	gen = (gen & ~1u) + 1;
	ST(generation, gen);
	ST(mode, mode);
	ST(on_ms, 0);
	ST(period_ms, 0);
	ST(escalate_until_ns, 0);
	gen++;
	ST(generation, gen);
	for (int i = 0; i < 200 && LD(applied_generation) != gen; i++)
		sleep_ms(5);
	if (LD(applied_generation) != gen)
		FAIL("duty generation %u not applied within 1 s", gen);
}

static int wait_for_state(uint32_t want, int ms)
{
	for (int i = 0; i < ms / 5 && LD(state) != want; i++)
		sleep_ms(5);
	return LD(state) == want;
}

/* Waits until the library has emitted `records` or dropped any, up to ms. */
static void wait_records(uint64_t records, uint64_t dropped0, int ms)
{
	for (int i = 0; i < ms / 10; i++) {
		if (LD(records) >= records || LD(lib_dropped) > dropped0)
			return;
		sleep_ms(10);
	}
}

int main(int argc, char **argv)
{
	if (argc < 3)
		FAIL("usage: test_drain LIB FAKE_CUPTI");
	setenv("SLOWRANK_CUPTI_LIB", argv[2], 1);
	setenv("SLOWRANK_CUPTI_QUIET", "1", 1);
	void *f = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
	if (!f)
		FAIL("dlopen %s: %s", argv[2], dlerror());
	*(void **)&launch = sym(f, "fakecupti_launch");
	*(void **)&counters = sym(f, "fakecupti_counters");
	void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	if (!h)
		FAIL("dlopen %s: %s", argv[1], dlerror());
	int (*init)(void) = sym(h, "InitializeInjection");
	volatile uint16_t *sem = sym(h, SLOWRANK_SYM_SEMAPHORE);
	ctl = sym(h, SLOWRANK_SYM_CONTROL);
	if (init() != 1)
		FAIL("InitializeInjection");

	/* The agent attaches (the kernel raises the semaphore), decides that
	 * no other CUPTI client runs, and turns collection on. */
	__atomic_add_fetch(sem, 1, __ATOMIC_RELAXED);
	for (int i = 0; i < 400 && !(LD(status_flags) & SLOWRANK_STATUS_WAITING); i++)
		sleep_ms(5);
	ST(yield, 0u);
	ST(foreign_since_ns, 0);
	ST(cupti_gen, LD(cupti_gen) + 1);
	duty(SLOWRANK_DUTY_ALWAYS);
	if (!wait_for_state(SLOWRANK_STATE_ON, 2000))
		FAIL("collection not on: state %u", LD(state));

	/* queued: 20 kernels the GPU runs after the disable. */
	const int n = 20;
	uint64_t r0 = LD(records), d0 = LD(lib_dropped);
	for (int i = 0; i < n; i++)
		launch(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, "ampere_sgemm_128x64_nn",
		       (200ull + 50ull * (uint64_t)i) * 1000000ull, (uint32_t)(i + 1));
	sleep_ms(10);
	uint64_t off_at = now_ns();
	duty(SLOWRANK_DUTY_OFF);
	wait_records(r0 + (uint64_t)n, d0, 2500);
	uint64_t got = LD(records) - r0, dropped = LD(lib_dropped) - d0;
	printf("test_drain: queued: %llu of %d records emitted, %llu dropped, %.0f ms after the disable\n",
	       (unsigned long long)got, n, (unsigned long long)dropped, (double)(now_ns() - off_at) / 1e6);
	if (dropped != 0 || got < (uint64_t)n)
		FAIL("records of kernels still queued at the disable were lost: %llu of %d emitted, %llu dropped",
		     (unsigned long long)got, n, (unsigned long long)dropped);

	/* hung: a kernel that outlasts the drain. */
	duty(SLOWRANK_DUTY_ALWAYS);
	if (!wait_for_state(SLOWRANK_STATE_ON, 2000))
		FAIL("collection not on again: state %u", LD(state));
	d0 = LD(lib_dropped);
	launch(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, "hung", 30ull * 1000000000ull, (uint32_t)(n + 1));
	sleep_ms(10);
	off_at = now_ns();
	duty(SLOWRANK_DUTY_OFF);
	struct fakecupti_counters c;
	int back = 0;
	for (int i = 0; i < 600 && !back; i++) {
		sleep_ms(10);
		counters(&c);
		back = c.buffers_completed == c.buffers_requested;
	}
	double ms = (double)(now_ns() - off_at) / 1e6;
	sleep_ms(200); /* the batch with the drop's count */
	printf("test_drain: hung: buffers back %d after %.0f ms (%llu requested, %llu completed), %llu dropped\n", back,
	       ms, (unsigned long long)c.buffers_requested, (unsigned long long)c.buffers_completed,
	       (unsigned long long)(LD(lib_dropped) - d0));
	if (!back)
		FAIL("the library left its buffers in CUPTI for 6 s after collection went off");
	if (ms < 2500)
		FAIL("buffers forced back after %.0f ms: a queued kernel's record would be lost", ms);
	if (LD(lib_dropped) - d0 != 1)
		FAIL("the hung kernel's incomplete record: %llu dropped, want 1 (counted)",
		     (unsigned long long)(LD(lib_dropped) - d0));
	__atomic_sub_fetch(sem, 1, __ATOMIC_RELAXED);
	printf("test_drain: ok\n");
	return 0;
}
