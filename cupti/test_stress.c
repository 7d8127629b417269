//go:build ignore

/*
 * test_stress.c - the injection library's life cycle under a random schedule,
 * against the fake libcupti (test/fakelibs/cupti.c, CUPTI's contract):
 *
 *   application  APP_THREADS threads launch kernels, copies and memsets
 *                (fakecupti_launch) as the driver would report them;
 *   agent        raises and drops the uprobe semaphore at random (attach,
 *                detach, restart, SIGKILL = drop without a last write),
 *                writes random duty configurations with the seqlock
 *                (bad ones too: period 0, tiny periods, torn writes), and
 *                makes the yield decision the real agent makes from its
 *                libcupti uprobes, after a random 0-2 ms reaction time,
 *                with the other client's callbacks, clock and kinds as
 *                its uprobes saw them (Handback in slowrank_abi.h;
 *                STRESS_OLD_AGENT=1: an agent without it);
 *   Kineto       a second CUPTI client as torch.profiler drives CUPTI:
 *                cuptiSubscribe once (kept), then sessions of
 *                RegisterTimestampCallback (its own clock), RegisterCallbacks,
 *                Enable, run, Disable, FlushAll(FORCED); sometimes
 *                cuptiFinalize (TEARDOWN_CUPTI=1); half of its sessions
 *                start 0-1 ms after the agent said "no other client", as
 *                the library takes CUPTI (its registration races Kineto's).
 * Checks: no crash, hang or sanitizer report (build it with ASan or TSan);
 * every kernel that ran inside a Kineto session reached Kineto, except what
 * ran inside the agent's reaction time when the session started while the
 * library was collecting or taking CUPTI (launched before the library was
 * seen yielded, at most 250 ms into the session: a share of records would
 * not do, a loaded machine launches few in a session; with STRESS_OLD_AGENT=1 nothing protects a session whose start
 * raced the library's registration, and such races are not only those
 * within 60 ms of a "no other client" decision (activities lost 0.3-0.7 s
 * into a session were seen under load), so every session is counted apart
 * and one that lost most of its records must show in the library's
 * counters); the library hands
 * CUPTI no buffer twice (the fake aborts); after the last session the
 * library collects again (records counter moves).
 *
 * Usage: test_stress LIB FAKE_CUPTI [SECONDS [external]]   (env STRESS_SEED=N)
 *
 * external: a real slowrank agent plays the agent (uprobes on the emit
 * function and on the fake libcupti's entry points); the program is then a
 * training process with a user's profiler (test/reliability).
 */
#define _GNU_SOURCE
#include "slowrank_abi.h"
#include "test_clock.h"

#include "../test/fakelibs/fakecupti.h"

#include <cupti.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define APP_THREADS 3
#define MAX_LAUNCHES (1u << 21)

#define FAIL(...)                                      \
	do {                                           \
		fprintf(stderr, "FAIL: " __VA_ARGS__); \
		fprintf(stderr, "\n");                 \
		exit(1);                               \
	} while (0)

static struct {
	fakecupti_launch_fn launch;
	fakecupti_counters_fn counters;
	CUptiResult (*subscribe)(CUpti_SubscriberHandle *, CUpti_CallbackFunc, void *);
	CUptiResult (*reg)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc);
	CUptiResult (*reg_ts)(CUpti_TimestampCallbackFunc);
	CUptiResult (*enable)(CUpti_ActivityKind);
	CUptiResult (*disable)(CUpti_ActivityKind);
	CUptiResult (*flush)(uint32_t);
	CUptiResult (*next)(uint8_t *, size_t, CUpti_Activity **);
	CUptiResult (*finalize)(void);
} fc;

static struct slowrank_cupti_control *ctl;
static volatile uint16_t *sem;
static int stop_all; /* atomic */
#define STOPPED() __atomic_load_n(&stop_all, __ATOMIC_ACQUIRE)
#define SET_STOP(v) __atomic_store_n(&stop_all, (v), __ATOMIC_RELEASE)

/* xorshift64*, one state per thread */
static uint64_t rnd(uint64_t *s)
{
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * 2685821657736338717ull;
}

static uint64_t between(uint64_t *s, uint64_t lo, uint64_t hi)
{
	return lo + rnd(s) % (hi - lo + 1);
}

/* ---- the application ----------------------------------------------------- */

struct launch {
	uint64_t t0, t1, dur; /* t0 before, t1 after the launch call */
};
static struct launch *launches;
static uint32_t next_id = 1;
static uint64_t seed;
static int external; /* a real agent attaches, decides and writes the duty */

static const char *const names[] = {"ampere_sgemm_128x64_nn", "void at::native::vectorized_elementwise_kernel",
				    "flash_fwd_kernel", "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
				    "void cutlass::Kernel<cutlass_80_tensorop_bf16>"};

static void *app_main(void *arg)
{
	uint64_t s = seed ^ (uint64_t)(uintptr_t)arg * 0x9e3779b97f4a7c15ull;
	while (!STOPPED()) {
		uint32_t id = __atomic_fetch_add(&next_id, 1, __ATOMIC_RELAXED);
		if (id >= MAX_LAUNCHES)
			break;
		uint64_t r = between(&s, 0, 99);
		int kind = r < 90   ? CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL
			   : r < 95 ? CUPTI_ACTIVITY_KIND_MEMCPY
				    : CUPTI_ACTIVITY_KIND_MEMSET;
		uint64_t dur = between(&s, 20000, 400000);
		struct launch *l = &launches[id];
		__atomic_store_n(&l->dur, dur, __ATOMIC_RELAXED);
		__atomic_store_n(&l->t0, now_ns(), __ATOMIC_RELAXED);
		fc.launch(kind, names[id % 5], dur, id);
		__atomic_store_n(&l->t1, now_ns(), __ATOMIC_RELEASE);
		sleep_us(between(&s, 20, 150));
	}
	return NULL;
}

/* ---- the agent ------------------------------------------------------------ */

static pthread_mutex_t agent_mu = PTHREAD_MUTEX_INITIALIZER;
static int attached;
static int kineto_active; /* a session is running (the agent's uprobes saw it) */
static uint64_t kineto_since;
static uint32_t gen;           /* duty seqlock generation */
static int window_open;        /* a session started, the agent's decision not landed yet */
static uint64_t last_clear_ns; /* when the agent last decided "no other client" */
static uint64_t last_yield_ns; /* when the agent last decided "yield" */
static int window_detached;    /* ... and the agent went away inside that window */
static uint64_t n_attach, n_kill, n_restart, n_torn, n_bad, n_decisions;
static int old_agent;                                      /* STRESS_OLD_AGENT=1: no Handback */
static pthread_cond_t clear_cv = PTHREAD_COND_INITIALIZER; /* a "no other client" decision */
static uint64_t n_clears;

/* What the agent's uprobes saw of Kineto's calls (entry times), published
 * with each decision (Handback). */
static struct {
	uint64_t req, comp, pair_ns, ts, ts_ns, kinds;
	uint32_t flags;
} seen;

static struct slowrank_cupti_handback *hb;
#define HB(f) __atomic_load_n(&hb->f, __ATOMIC_RELAXED)

#define ST(f, v) __atomic_store_n(&ctl->f, (v), __ATOMIC_RELEASE)

static void trace(const char *what)
{
	if (!getenv("STRESS_TRACE"))
		return;
	uint64_t t = now_ns();
	fprintf(stderr, "%llu.%06llu %s\n", (unsigned long long)(t / 1000000000ull),
		(unsigned long long)(t / 1000ull % 1000000ull), what);
}

/* Caller holds agent_mu. */
static void decide(void)
{
	if (getenv("STRESS_TRACE")) {
		uint64_t t = now_ns();
		fprintf(stderr, "agent: %llu.%03llu decide yield=%d\n", (unsigned long long)(t / 1000000000ull),
			(unsigned long long)(t / 1000000ull % 1000ull), kineto_active);
	}
	if (kineto_active)
		last_yield_ns = now_ns();
	if (!kineto_active) {
		last_clear_ns = now_ns();
		n_clears++;
		pthread_cond_broadcast(&clear_cv);
	}
	if (!old_agent && hb) { /* the seqlock, then the decision */
		uint32_t q = __atomic_load_n(&hb->seq, __ATOMIC_RELAXED);
		__atomic_store_n(&hb->seq, q + 1, __ATOMIC_RELEASE);
		__atomic_store_n(&hb->flags, seen.flags, __ATOMIC_RELAXED);
		__atomic_store_n(&hb->request_fn, seen.req, __ATOMIC_RELAXED);
		__atomic_store_n(&hb->complete_fn, seen.comp, __ATOMIC_RELAXED);
		__atomic_store_n(&hb->pair_ns, seen.pair_ns, __ATOMIC_RELAXED);
		__atomic_store_n(&hb->timestamp_fn, seen.ts, __ATOMIC_RELAXED);
		__atomic_store_n(&hb->timestamp_ns, seen.ts_ns, __ATOMIC_RELAXED);
		__atomic_store_n(&hb->kinds, seen.kinds, __ATOMIC_RELAXED);
		__atomic_store_n(&hb->seq, q + 2, __ATOMIC_RELEASE);
	}
	ST(foreign_since_ns, kineto_active ? kineto_since : 0);
	ST(yield, kineto_active ? 1u : 0u);
	ST(cupti_gen, __atomic_load_n(&ctl->cupti_gen, __ATOMIC_RELAXED) + 1);
	n_decisions++;
}

/* As the agent: decide once the library reports that it waits for the
 * decision (it has seen the attach), after a reaction time. */
static void wait_then_decide(uint64_t delay_us)
{
	for (int i = 0; i < 2000; i++) {
		if (__atomic_load_n(&ctl->status_flags, __ATOMIC_ACQUIRE) & SLOWRANK_STATUS_WAITING)
			break;
		sleep_us(500);
	}
	sleep_us(delay_us);
	pthread_mutex_lock(&agent_mu);
	if (attached)
		decide();
	pthread_mutex_unlock(&agent_mu);
}

static void write_duty(uint64_t *s)
{
	uint32_t mode, on = 0, period = 0;
	uint64_t esc = 0;
	switch (between(s, 0, 9)) {
	case 0:
		mode = SLOWRANK_DUTY_ALWAYS;
		break;
	case 1:
		mode = SLOWRANK_DUTY_OFF;
		break;
	case 2:
		mode = SLOWRANK_DUTY_TIME;
		on = 0;
		period = 0;
		n_bad++;
		break; /* must mean off */
	case 3:
		mode = SLOWRANK_DUTY_TIME;
		on = 5;
		period = 20;
		n_bad++;
		break; /* under the minimum */
	case 4:
		mode = SLOWRANK_DUTY_TIME;
		on = 10;
		period = 100;
		esc = now_ns() + between(s, 1, 80) * 1000000ull;
		break;
	default:
		mode = SLOWRANK_DUTY_TIME;
		on = (uint32_t)between(s, 1, 60);
		period = (uint32_t)between(s, 100, 300);
		break;
	}
	gen = (gen & ~1u) + 1;
	ST(generation, gen);
	ST(mode, mode);
	ST(on_ms, on);
	ST(period_ms, period);
	ST(escalate_until_ns, esc);
	if (between(s, 0, 49) == 0) { /* the agent died mid-write: generation stays odd */
		n_torn++;
		return;
	}
	gen++;
	ST(generation, gen);
}

static void *agent_main(void *arg)
{
	(void)arg;
	uint64_t s = seed * 31 + 7;
	while (!STOPPED()) {
		pthread_mutex_lock(&agent_mu);
		__atomic_add_fetch(sem, 1, __ATOMIC_RELAXED); /* the kernel, at uprobe attach */
		attached = 1;
		trace("agent attach");
		n_attach++;
		pthread_mutex_unlock(&agent_mu);
		wait_then_decide(between(&s, 0, 3000));
		uint64_t until = now_ns() + between(&s, 5, 400) * 1000000ull;
		while (now_ns() < until && !STOPPED()) {
			if (between(&s, 0, 3) == 0) {
				pthread_mutex_lock(&agent_mu);
				write_duty(&s);
				pthread_mutex_unlock(&agent_mu);
			}
			sleep_us(between(&s, 500, 20000));
		}
		pthread_mutex_lock(&agent_mu);
		uint64_t how = between(&s, 0, 9);
		if (how == 0)
			n_kill++; /* SIGKILL: the kernel drops the uprobes, nothing else */
		__atomic_sub_fetch(sem, 1, __ATOMIC_RELAXED);
		attached = 0;
		trace("agent detach");
		/* Gone before its decision landed, or before the library acted
		 * on it: nothing protects the session. */
		if (window_open ||
		    (kineto_active && __atomic_load_n(&ctl->state, __ATOMIC_RELAXED) != SLOWRANK_STATE_YIELDED))
			window_detached = 1;
		pthread_mutex_unlock(&agent_mu);
		if (how == 1) {
			n_restart++;
			continue; /* a restart: attach again at once */
		}
		sleep_us(between(&s, 0, 200000));
	}
	/* The end: attached, collecting, no other client. */
	pthread_mutex_lock(&agent_mu);
	if (!attached) {
		__atomic_add_fetch(sem, 1, __ATOMIC_RELAXED);
		attached = 1;
	}
	gen = (gen & ~1u) + 1;
	ST(generation, gen);
	ST(mode, SLOWRANK_DUTY_ALWAYS);
	ST(escalate_until_ns, 0);
	gen++;
	ST(generation, gen);
	pthread_mutex_unlock(&agent_mu);
	wait_then_decide(0);
	return NULL;
}

/* ---- Kineto ---------------------------------------------------------------- */

static pthread_mutex_t k_mu = PTHREAD_MUTEX_INITIALIZER;
static uint8_t *k_bufs[4096];
static uint8_t *k_seen; /* ids delivered to Kineto with timestamps */
static uint64_t k_unknown, k_sessions, k_finalizes, k_checked, k_missing, k_races;

/* Kineto's clock: TSC ticks (getApproximateTime), not nanoseconds. */
static uint64_t CUPTIAPI k_clock(void)
{
#if defined(__x86_64__)
	return __builtin_ia32_rdtsc();
#else
	return now_ns() * 3 + 12345;
#endif
}

static void CUPTIAPI k_req(uint8_t **buf, size_t *size, size_t *max)
{
	*buf = malloc(256 * 1024);
	*size = *buf ? 256 * 1024 : 0;
	*max = 0;
	pthread_mutex_lock(&k_mu);
	for (int i = 0; i < 4096; i++)
		if (!k_bufs[i]) {
			k_bufs[i] = *buf;
			break;
		}
	pthread_mutex_unlock(&k_mu);
}

static void CUPTIAPI k_comp(CUcontext c, uint32_t st, uint8_t *buf, size_t size, size_t valid)
{
	(void)c;
	(void)st;
	(void)size;
	int known = 0;
	pthread_mutex_lock(&k_mu);
	for (int i = 0; i < 4096; i++)
		if (k_bufs[i] == buf) {
			k_bufs[i] = NULL;
			known = 1;
			break;
		}
	if (!known) {
		k_unknown++; /* Kineto logs "unknown buffer" and returns */
		pthread_mutex_unlock(&k_mu);
		return;
	}
	CUpti_Activity *r = NULL;
	while (fc.next(buf, valid, &r) == CUPTI_SUCCESS) {
		const CUpti_ActivityKernel4 *k = (const CUpti_ActivityKernel4 *)r;
		uint32_t id = r->kind == CUPTI_ACTIVITY_KIND_MEMCPY   ? ((const CUpti_ActivityMemcpy *)r)->correlationId
			      : r->kind == CUPTI_ACTIVITY_KIND_MEMSET ? ((const CUpti_ActivityMemset *)r)->correlationId
								      : k->correlationId;
		if (k->start != 0 && id < MAX_LAUNCHES)
			k_seen[id] = 1;
	}
	pthread_mutex_unlock(&k_mu);
	free(buf);
}

static void noop(void *u, CUpti_CallbackDomain d, CUpti_CallbackId id, const void *p)
{
	(void)u;
	(void)d;
	(void)id;
	(void)p;
}

static const CUpti_ActivityKind k_kinds[] = {CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMSET,
					     CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL};

/* The agent's decision lands after its reaction time (ring buffer, main
 * loop, /proc/PID/mem write); an agent that attaches meanwhile decides from
 * what its uprobes saw. */
static uint64_t n_racy;

static void react(uint64_t *s)
{
	if (external)
		return; /* the real agent's uprobes fired at the calls themselves */
	sleep_us(between(s, 0, 2000));
	pthread_mutex_lock(&agent_mu);
	if (attached)
		decide();
	window_open = 0;
	pthread_mutex_unlock(&agent_mu);
}

/* The schedule has had enough attaches and Kineto sessions to mean
 * something (the final check wants at least 5 and 1). */
static int schedule_long_enough(void)
{
	pthread_mutex_lock(&agent_mu);
	int ok = n_attach >= 5;
	pthread_mutex_unlock(&agent_mu);
	return ok && __atomic_load_n(&k_sessions, __ATOMIC_RELAXED) >= 1;
}

static uint64_t fn_u64(const void *p, size_t n)
{
	uint64_t v = 0;
	memcpy(&v, p, n < sizeof(v) ? n : sizeof(v));
	return v;
}

/* The agent's uprobe at the entry of one of Kineto's calls. */
enum k_call { K_TS, K_REG, K_ENABLE, K_DISABLE, K_FINALIZE };
static void uprobe(enum k_call c, int kind)
{
	pthread_mutex_lock(&agent_mu);
	uint64_t t = now_ns();
	switch (c) {
	case K_TS:
		seen.ts = fn_u64(&(CUpti_TimestampCallbackFunc){k_clock}, sizeof(CUpti_TimestampCallbackFunc));
		seen.ts_ns = t;
		seen.flags |= SLOWRANK_HANDBACK_F_CLOCK;
		break;
	case K_REG:
		seen.req = fn_u64(&(CUpti_BuffersCallbackRequestFunc){k_req}, sizeof(CUpti_BuffersCallbackRequestFunc));
		seen.comp =
			fn_u64(&(CUpti_BuffersCallbackCompleteFunc){k_comp}, sizeof(CUpti_BuffersCallbackCompleteFunc));
		seen.pair_ns = t;
		seen.flags |= SLOWRANK_HANDBACK_F_PAIR;
		break;
	case K_ENABLE:
		seen.kinds |= 1ull << kind;
		break;
	case K_DISABLE:
		seen.kinds &= ~(1ull << kind);
		break;
	case K_FINALIZE:
		seen.kinds = 0;
		break;
	}
	seen.flags |= SLOWRANK_HANDBACK_F_KINDS;
	pthread_mutex_unlock(&agent_mu);
}

static uint64_t n_aimed, n_aimed_close, n_taken_sessions;
/* Longest from the start of a session that lost records to the library's
 * yield: the agent's reaction (0-2 ms here) and the library's poll, plus
 * what a loaded 2-core machine adds to both. */
static uint64_t k_react_max;
#define SESSION_REACT_MAX_NS (250ull * 1000000ull)

/* When the library was first seen yielded to the session (0: not by t_end).
 * Until then CUPTI's current buffer may be the library's, with the
 * session's first records in it: those are the agent's reaction time. */
static uint64_t wait_yielded(uint64_t t_end)
{
	for (;;) {
		uint64_t t = now_ns();
		if (__atomic_load_n(&ctl->state, __ATOMIC_ACQUIRE) == SLOWRANK_STATE_YIELDED)
			return t;
		if (t >= t_end)
			return 0;
		sleep_us(100);
	}
}

static void kineto_session(uint64_t *s)
{
	pthread_mutex_lock(&agent_mu);
	kineto_since = now_ns();
	kineto_active = 1; /* the uprobe on the first call below fires now */
	window_open = 1;
	/* A session that starts right after the agent said "no other client"
	 * can find its callbacks taken by the library acting on that decision:
	 * the library gives them back (Handback) and the session is checked;
	 * with an agent without Handback it is not checked, and one that lost
	 * most of its records must show in the library's counters. */
	int close_to_clear = !external && kineto_since - last_clear_ns < 60ull * 1000000ull;
	n_aimed_close += close_to_clear;
	window_detached = 0;
	pthread_mutex_unlock(&agent_mu);
	uprobe(K_TS, 0);
	fc.reg_ts(k_clock);
	uprobe(K_REG, 0);
	fc.reg(k_req, k_comp);
	for (size_t i = 0; i < 3; i++) {
		uprobe(K_ENABLE, k_kinds[i]);
		fc.enable(k_kinds[i]);
	}
	uint64_t t_on = now_ns();
	if (getenv("STRESS_TRACE"))
		fprintf(stderr, "kineto: %llu.%03llu session %llu on\n", (unsigned long long)(t_on / 1000000000ull),
			(unsigned long long)(t_on / 1000000ull % 1000ull), (unsigned long long)k_sessions + 1);
	react(s);
	uint64_t t_end = now_ns() + 1000ull * between(s, 300000, 800000); /* ~13 steps of 25-60 ms */
	uint64_t t_yielded = wait_yielded(t_end);
	if (now_ns() < t_end)
		sleep_us((t_end - now_ns()) / 1000ull);
	uint64_t t_off = now_ns();
	if (getenv("STRESS_TRACE"))
		fprintf(stderr, "kineto: %llu.%03llu session off\n", (unsigned long long)(t_off / 1000000000ull),
			(unsigned long long)(t_off / 1000000ull % 1000ull));
	for (size_t i = 0; i < 3; i++) {
		uprobe(K_DISABLE, k_kinds[i]);
		fc.disable(k_kinds[i]);
	}
	fc.flush(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
	int fin = between(s, 0, 5) == 0;
	if (fin) {
		uprobe(K_FINALIZE, 0);
		fc.finalize();
		k_finalizes++;
	}
	pthread_mutex_lock(&agent_mu);
	kineto_active = 0;
	int detached = window_detached; /* agent gone inside its reaction time: nothing protects */
	int racy = detached || old_agent;
	pthread_mutex_unlock(&agent_mu);
	react(s);
	__atomic_add_fetch(&k_sessions, 1, __ATOMIC_RELAXED); /* read by the main thread meanwhile */
	/* Every activity that ran entirely inside [t_on, t_off] reached Kineto. */
	uint32_t last = __atomic_load_n(&next_id, __ATOMIC_RELAXED);
	uint64_t expected = 0, missing = 0, late = 0;
	pthread_mutex_lock(&k_mu);
	for (uint32_t id = 1; id < last && id < MAX_LAUNCHES; id++) {
		struct launch *l = &launches[id];
		uint64_t t1 = __atomic_load_n(&l->t1, __ATOMIC_ACQUIRE);
		uint64_t t0 = __atomic_load_n(&l->t0, __ATOMIC_RELAXED);
		uint64_t dur = __atomic_load_n(&l->dur, __ATOMIC_RELAXED);
		if (t1 == 0 || t0 < t_on || t1 + dur > t_off)
			continue;
		expected++;
		missing += !k_seen[id];
		late += !k_seen[id] && (t_yielded == 0 || t0 >= t_yielded);
		if (!k_seen[id] && getenv("STRESS_TRACE"))
			fprintf(stderr,
				"  missing id %u: t0 %+.1f ms from session on, %+.1f ms from the yield decision\n", id,
				((double)t0 - (double)t_on) / 1e6, ((double)t0 - (double)last_yield_ns) / 1e6);
	}
	pthread_mutex_unlock(&k_mu);
	if (racy) {
		n_racy++;
		if (!detached && expected > 0 && missing * 2 > expected)
			n_taken_sessions++; /* the library must have counted it (callbacks taken) */
		fprintf(stderr,
			"  session %llu: unprotected (agent gone inside its reaction time, or without hand-back): %llu of %llu missing (not checked)\n",
			(unsigned long long)k_sessions, (unsigned long long)missing, (unsigned long long)expected);
		return;
	}
	k_checked += expected;
	if (missing && t_yielded != 0 && t_yielded - t_on > k_react_max)
		k_react_max = t_yielded - t_on;
	if (missing) {
		k_races++;
		k_missing += missing;
		fprintf(stderr,
			"  session %llu: %llu of %llu activities missing, %llu after the library yielded "
			"(%.1f ms after the session began)\n",
			(unsigned long long)k_sessions, (unsigned long long)missing, (unsigned long long)expected,
			(unsigned long long)late, t_yielded ? ((double)t_yielded - (double)t_on) / 1e6 : -1.0);
		if (late)
			FAIL("Kineto lost %llu of %llu activities that ran after the library had yielded to it",
			     (unsigned long long)late, (unsigned long long)expected);
	}
	if (fin)
		sleep_us(50000);
}

static void *kineto_main(void *arg)
{
	(void)arg;
	uint64_t s = seed * 131 + 3;
	CUpti_SubscriberHandle sub;
	int subscribed = 0;
	while (!STOPPED()) {
		sleep_us(between(&s, 100000, 600000));
		if (STOPPED())
			break;
		if (!subscribed) /* libkineto_init: once, kept for the process's life */
			subscribed = fc.subscribe(&sub, noop, NULL) == CUPTI_SUCCESS;
		if (!external && between(&s, 0, 1) == 0) {
			/* Aim at the race: start just after a "no other client"
			 * decision, as the library takes CUPTI on it. */
			n_aimed++;
			pthread_mutex_lock(&agent_mu);
			uint64_t c0 = n_clears;
			struct timespec dl;
			clock_gettime(CLOCK_REALTIME, &dl);
			dl.tv_sec += 2;
			while (n_clears == c0 && !STOPPED())
				if (pthread_cond_timedwait(&clear_cv, &agent_mu, &dl) != 0)
					break;
			pthread_mutex_unlock(&agent_mu);
			sleep_us(between(&s, 0, 1000));
		}
		kineto_session(&s);
	}
	return NULL;
}

/* ---- main ------------------------------------------------------------------ */

static void *sym(void *h, const char *name)
{
	void *p = dlsym(h, name);
	if (!p)
		FAIL("missing symbol %s", name);
	return p;
}

int main(int argc, char **argv)
{
	if (argc < 3)
		FAIL("usage: test_stress LIB FAKE_CUPTI [SECONDS]");
	double secs = argc > 3 ? atof(argv[3]) : 8;
	external = argc > 4 && strcmp(argv[4], "external") == 0;
	old_agent = getenv("STRESS_OLD_AGENT") && strcmp(getenv("STRESS_OLD_AGENT"), "1") == 0;
	const char *se = getenv("STRESS_SEED");
	seed = se && *se ? strtoull(se, NULL, 10) : (uint64_t)time(NULL);
	if (seed == 0)
		seed = 1;
	printf("test_stress: seed %llu (STRESS_SEED=%llu to repeat), %.0f s\n", (unsigned long long)seed,
	       (unsigned long long)seed, secs);
	fflush(stdout);
	setenv("SLOWRANK_CUPTI_LIB", argv[2], 1);
	setenv("SLOWRANK_CUPTI_QUIET", "1", 1);
	launches = calloc(MAX_LAUNCHES, sizeof(*launches));
	k_seen = calloc(MAX_LAUNCHES, 1);
	if (!launches || !k_seen)
		FAIL("out of memory");

	void *f = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
	if (!f)
		FAIL("dlopen %s: %s", argv[2], dlerror());
	*(void **)&fc.launch = sym(f, "fakecupti_launch");
	*(void **)&fc.counters = sym(f, "fakecupti_counters");
	*(void **)&fc.subscribe = sym(f, "cuptiSubscribe");
	*(void **)&fc.reg = sym(f, "cuptiActivityRegisterCallbacks");
	*(void **)&fc.reg_ts = sym(f, "cuptiActivityRegisterTimestampCallback");
	*(void **)&fc.enable = sym(f, "cuptiActivityEnable");
	*(void **)&fc.disable = sym(f, "cuptiActivityDisable");
	*(void **)&fc.flush = sym(f, "cuptiActivityFlushAll");
	*(void **)&fc.next = sym(f, "cuptiActivityGetNextRecord");
	*(void **)&fc.finalize = sym(f, "cuptiFinalize");

	void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	if (!h)
		FAIL("dlopen %s: %s", argv[1], dlerror());
	int (*init)(void) = sym(h, "InitializeInjection");
	sem = sym(h, SLOWRANK_SYM_SEMAPHORE);
	ctl = sym(h, SLOWRANK_SYM_CONTROL);
	if (init() != 1)
		FAIL("InitializeInjection");
	hb = (struct slowrank_cupti_handback *)(uintptr_t)__atomic_load_n(&ctl->handback_addr, __ATOMIC_ACQUIRE);
	if (!hb || hb != sym(h, SLOWRANK_SYM_HANDBACK) || hb->magic != SLOWRANK_HANDBACK_MAGIC ||
	    hb->size != sizeof(*hb))
		FAIL("handback block: control block points at %p", (void *)hb);

	pthread_t app[APP_THREADS], agent, kineto;
	for (int i = 0; i < APP_THREADS; i++)
		pthread_create(&app[i], NULL, app_main, (void *)(uintptr_t)(i + 1));
	if (!external)
		pthread_create(&agent, NULL, agent_main, NULL);
	else /* wait for the real agent: it has attached and decided */
		for (int i = 0; i < 300 && __atomic_load_n(&ctl->state, __ATOMIC_RELAXED) != SLOWRANK_STATE_ON; i++)
			sleep_us(100000);
	pthread_create(&kineto, NULL, kineto_main, NULL);
	uint64_t end = now_ns() + (uint64_t)(secs * 1e9);
	/* A slow machine (TSan on 2 loaded cores) may need longer for a
	 * schedule that means something: up to 4 times as long. */
	uint64_t last = now_ns() + (uint64_t)(4 * secs * 1e9);
	uint64_t ms = seed * 17 + 5;
	while (now_ns() < end || (!external && !schedule_long_enough() && now_ns() < last)) {
		sleep_us(100000);
		if (between(&ms, 0, 19) == 0) { /* fork during collection: the child must live */
			pid_t p = fork();
			if (p == 0)
				_exit(0);
			if (p > 0) {
				int st = 0;
				waitpid(p, &st, 0);
				if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
					FAIL("forked child died: status %d", st);
			}
		}
	}
	/* Stop Kineto and the agent's schedule; the agent ends attached, mode
	 * always, yield 0. The app keeps launching. */
	SET_STOP(1);
	pthread_join(kineto, NULL);
	if (!external)
		pthread_join(agent, NULL);
	SET_STOP(0);
	pthread_t tail;
	pthread_create(&tail, NULL, app_main, (void *)(uintptr_t)99);
	uint64_t r0 = __atomic_load_n(&ctl->records, __ATOMIC_RELAXED);
	int resumed = 0;
	for (int i = 0; i < (external ? 300 : 60) && !resumed; i++) {
		sleep_us(50000);
		resumed = __atomic_load_n(&ctl->records, __ATOMIC_RELAXED) > r0 &&
			  __atomic_load_n(&ctl->state, __ATOMIC_RELAXED) == SLOWRANK_STATE_ON;
	}
	SET_STOP(1);
	for (int i = 0; i < APP_THREADS; i++)
		pthread_join(app[i], NULL);
	pthread_join(tail, NULL);

	struct fakecupti_counters c;
	fc.counters(&c);
	printf("test_stress: %llu attaches (%llu kills, %llu restarts), %llu torn and %llu bad duty writes, "
	       "%llu decisions\n",
	       (unsigned long long)n_attach, (unsigned long long)n_kill, (unsigned long long)n_restart,
	       (unsigned long long)n_torn, (unsigned long long)n_bad, (unsigned long long)n_decisions);
	printf("test_stress: Kineto %llu sessions (%llu finalized, %llu with the agent killed or deciding inside its "
	       "reaction time), %llu activities checked, %llu missing in %llu sessions, %llu unknown buffers\n",
	       (unsigned long long)k_sessions, (unsigned long long)k_finalizes, (unsigned long long)n_racy,
	       (unsigned long long)k_checked, (unsigned long long)k_missing, (unsigned long long)k_races,
	       (unsigned long long)k_unknown);
	printf("test_stress: the library yielded at most %.1f ms after a session began\n", (double)k_react_max / 1e6);
	printf("test_stress: %llu sessions lost most of their records to the library's registration (old agent)\n",
	       (unsigned long long)n_taken_sessions);
	printf("test_stress: %s agent; %llu sessions aimed at the library's registration, %llu started within 60 ms "
	       "of a 'no other client' decision; library: %llu pairs and %llu clocks given back, %llu buffers "
	       "forwarded, %llu sessions with callbacks possibly taken, %llu pairs refused\n",
	       old_agent ? "old (no handback)" : "handback", (unsigned long long)n_aimed,
	       (unsigned long long)n_aimed_close, (unsigned long long)HB(handbacks),
	       (unsigned long long)HB(clock_handbacks), (unsigned long long)HB(forwarded),
	       (unsigned long long)HB(taken), (unsigned long long)HB(rejected));
	printf("test_stress: fake CUPTI %llu launches, %llu records, %llu buffers requested, %llu completed, "
	       "%llu lost to finalize; library: %u yields, %llu orphaned buffers, batches %llu, records %llu\n",
	       (unsigned long long)c.launches, (unsigned long long)c.records, (unsigned long long)c.buffers_requested,
	       (unsigned long long)c.buffers_completed, (unsigned long long)c.buffers_lost_finalize,
	       __atomic_load_n(&ctl->yields, __ATOMIC_RELAXED),
	       (unsigned long long)__atomic_load_n(&ctl->buffers_orphaned, __ATOMIC_RELAXED),
	       (unsigned long long)__atomic_load_n(&ctl->batches, __ATOMIC_RELAXED),
	       (unsigned long long)__atomic_load_n(&ctl->records, __ATOMIC_RELAXED));
	if (!resumed)
		FAIL("collection did not resume after the last Kineto session (state %u)",
		     __atomic_load_n(&ctl->state, __ATOMIC_RELAXED));
	if (old_agent && n_taken_sessions > 0 && HB(taken) == 0)
		FAIL("%llu sessions lost their callbacks to the library's registration and the library counted none",
		     (unsigned long long)n_taken_sessions);
	if (k_sessions == 0 || (!external && n_attach < 5))
		FAIL("schedule too short to mean anything (%llu sessions, %llu attaches)",
		     (unsigned long long)k_sessions, (unsigned long long)n_attach);
	if (k_checked == 0 && !(old_agent && n_racy == k_sessions))
		FAIL("no activity ran inside a Kineto session");
	if (k_react_max > SESSION_REACT_MAX_NS)
		FAIL("the library yielded %.1f ms after a session began (more than %llu ms)", (double)k_react_max / 1e6,
		     (unsigned long long)(SESSION_REACT_MAX_NS / 1000000ull));
	printf("test_stress: ok\n");
	return 0;
}
