//go:build ignore

/*
 * test_quiet.c - the control thread's wake-ups while the library waits for
 * an agent's yield decision, against the fake libcupti
 * (test/fakelibs/cupti.c). A wake-up is a voluntary context switch of the
 * control thread (/proc/self/task/<ctl_tid>/status): each poll sleeps once.
 *
 *   undecided  the agent attached (the semaphore is up) and never writes
 *              cupti_gen: after SR_WAIT_FAST_NS the library backs off to
 *              at most SR_QUIET_MAX wake-ups a second (was ~900)
 *   late       a decision written then is acted on within one back-off
 *              interval (<= 200 ms) plus slack
 *   prompt     after a re-attach, a decision written as soon as the library
 *              waits is acted on within a few milliseconds (the normal path
 *              is not delayed)
 *   gone       the semaphore drops while the library waits (the agent
 *              exited): the wait ends and the thread polls as when idle
 *
 * Usage: test_quiet LIB FAKE_CUPTI
 */
#define _GNU_SOURCE
#include "slowrank_abi.h"
#include "test_clock.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FAIL(...)                                      \
	do {                                           \
		fprintf(stderr, "FAIL: " __VA_ARGS__); \
		fprintf(stderr, "\n");                 \
		exit(1);                               \
	} while (0)

/* Undecided and backed off: 5 a second (one per 200 ms), with room for a
 * loaded machine's extra wake-ups. */
#define SR_QUIET_MAX 15
/* Idle (no agent): the 50-ms poll, 20 a second. */
#define SR_IDLE_MAX 30
/* One back-off interval (200 ms) and room for a sanitizer on a loaded
 * machine, in ms. */
#define SR_SLACK_MAX 450

static struct slowrank_cupti_control *ctl;
static volatile uint16_t *sem;

#define LD(field) __atomic_load_n(&ctl->field, __ATOMIC_ACQUIRE)
#define ST(field, v) __atomic_store_n(&ctl->field, (v), __ATOMIC_RELEASE)

static void *sym(void *h, const char *name)
{
	void *p = dlsym(h, name);
	if (!p)
		FAIL("missing symbol %s", name);
	return p;
}

/* The control thread's voluntary context switches so far. */
static uint64_t wakeups(void)
{
	char path[64], buf[4096];
	snprintf(path, sizeof(path), "/proc/self/task/%u/status", LD(ctl_tid));
	FILE *f = fopen(path, "r");
	if (!f)
		FAIL("open %s", path);
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = 0;
	const char *p = strstr(buf, "\nvoluntary_ctxt_switches:");
	if (!p)
		FAIL("no voluntary_ctxt_switches in %s", path);
	return strtoull(p + strlen("\nvoluntary_ctxt_switches:"), NULL, 10);
}

/* Wake-ups a second over ms milliseconds. */
static double rate(int ms)
{
	uint64_t w0 = wakeups(), t0 = now_ns();
	sleep_ms((uint64_t)ms);
	return (double)(wakeups() - w0) * 1e9 / (double)(now_ns() - t0);
}

static int waiting(void)
{
	return (LD(status_flags) & SLOWRANK_STATUS_WAITING) != 0;
}

static void wait_waiting(int want)
{
	for (int i = 0; i < 2000 && waiting() != want; i++)
		sleep_us(500);
	if (waiting() != want)
		FAIL("waiting flag not %d within 1 s", want);
}

/* Writes "no other client" and returns the ms until the library saw it. */
static double decide(void)
{
	ST(yield, 0u);
	ST(foreign_since_ns, 0);
	uint64_t t0 = now_ns();
	ST(cupti_gen, LD(cupti_gen) + 1);
	while (waiting() && now_ns() - t0 < 2000000000ull)
		sleep_us(200);
	if (waiting())
		FAIL("decision not taken within 2 s");
	return (double)(now_ns() - t0) / 1e6;
}

int main(int argc, char **argv)
{
	if (argc < 3)
		FAIL("usage: test_quiet LIB FAKE_CUPTI");
	setenv("SLOWRANK_CUPTI_LIB", argv[2], 1);
	setenv("SLOWRANK_CUPTI_QUIET", "1", 1);
	void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	if (!h)
		FAIL("dlopen %s: %s", argv[1], dlerror());
	int (*init)(void) = sym(h, "InitializeInjection");
	sem = sym(h, SLOWRANK_SYM_SEMAPHORE);
	ctl = sym(h, SLOWRANK_SYM_CONTROL);
	if (init() != 1)
		FAIL("InitializeInjection");
	for (int i = 0; i < 400 && LD(ctl_tid) == 0; i++)
		sleep_ms(5);
	if (LD(ctl_tid) == 0)
		FAIL("no control thread");
	double idle = rate(1000);

	/* undecided */
	__atomic_add_fetch(sem, 1, __ATOMIC_RELAXED);
	wait_waiting(1);
	sleep_ms(1000); /* past SR_WAIT_FAST_NS and the back-off's ramp */
	double undecided = rate(2000);
	printf("test_quiet: idle %.1f wake-ups/s, attached and undecided %.1f wake-ups/s\n", idle, undecided);
	if (undecided > SR_QUIET_MAX)
		FAIL("%.1f wake-ups/s while waiting undecided, want <= %d", undecided, SR_QUIET_MAX);

	/* late */
	double late = decide();
	printf("test_quiet: a late decision taken after %.1f ms\n", late);
	if (late > SR_SLACK_MAX)
		FAIL("a late decision waited %.1f ms, more than one back-off interval (200 ms) and slack", late);

	/* prompt */
	__atomic_sub_fetch(sem, 1, __ATOMIC_RELAXED);
	wait_waiting(0);
	sleep_ms(300); /* the detach is seen within one poll */
	__atomic_add_fetch(sem, 1, __ATOMIC_RELAXED);
	wait_waiting(1);
	double prompt = decide();
	printf("test_quiet: a prompt decision taken after %.1f ms\n", prompt);
	if (prompt > 50)
		FAIL("a decision at the attach waited %.1f ms: the normal path is delayed", prompt);

	/* gone */
	__atomic_sub_fetch(sem, 1, __ATOMIC_RELAXED);
	sleep_ms(300);
	__atomic_add_fetch(sem, 1, __ATOMIC_RELAXED);
	wait_waiting(1);
	sleep_ms(700);
	uint64_t t0 = now_ns();
	__atomic_sub_fetch(sem, 1, __ATOMIC_RELAXED);
	wait_waiting(0);
	double ended = (double)(now_ns() - t0) / 1e6;
	double after = rate(1000);
	printf("test_quiet: agent gone: the wait ended after %.1f ms, then %.1f wake-ups/s\n", ended, after);
	if (ended > SR_SLACK_MAX || after > SR_IDLE_MAX)
		FAIL("after the agent left: wait ended after %.1f ms, %.1f wake-ups/s", ended, after);
	printf("test_quiet: ok\n");
	return 0;
}
