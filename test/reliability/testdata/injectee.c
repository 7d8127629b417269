//go:build ignore

/*
 * injectee.c - a stand-in for a training process that loads the CUPTI
 * injection library as the CUDA driver would (dlopen + InitializeInjection),
 * without a GPU. The reliability tests run it under the agent.
 *
 * Usage: injectee LIB MS [hostile|launch]
 *
 * For MS milliseconds the main thread ticks every 5 ms and measures how late
 * each tick wakes (a blocked process would show it), and prints one JSON line
 * every 50 ms with the semaphore (raised by the kernel while the agent's
 * uprobe is attached), the library state, the duty-cycle generation applied
 * and the worst tick lateness. With "hostile" it also hands the agent
 * malformed and adversarial batches through slowrank_cupti_emit, as a
 * compromised training process could: random bytes, lying lengths and
 * counts, and a flood of distinct maximum-length kernel names. With
 * "launch" (SLOWRANK_CUPTI_LIB naming the fake libcupti,
 * test/fakelibs/cupti.c) it launches a kernel every tick, as the driver
 * would report it, and its lines also carry the library's records, yields
 * and control thread id: device records flow once the agent let it collect.
 */
#define _GNU_SOURCE
#include "slowrank_abi.h"

#include "../../fakelibs/fakecupti.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static unsigned char buf[SLOWRANK_BATCH_MAX * 2];
static uint64_t seq;
static uint32_t next_name = 1;

static void hostile(void (*emit)(const void *, uint32_t), unsigned *rnd)
{
	/* 1: random bytes of a random length (also beyond BATCH_MAX). */
	uint32_t n = (uint32_t)(rand_r(rnd) % (SLOWRANK_BATCH_MAX + 4096));
	for (uint32_t i = 0; i < n; i++)
		buf[i] = (unsigned char)rand_r(rnd);
	emit(buf, n);
	/* 2: a valid header that lies about its records and length. */
	struct slowrank_batch_header *h = (void *)buf;
	memset(buf, 0, 4096);
	h->magic = SLOWRANK_BATCH_MAGIC;
	h->version = SLOWRANK_ABI_VERSION;
	h->pid = (uint32_t)getpid();
	h->count = 0xffffffffu;
	h->seq = ++seq;
	h->total_len = 4096;
	h->header_size = sizeof(*h);
	emit(buf, 4096);
	h->total_len = 0xffffffffu;
	emit(buf, 1u << 31);
	/* 3: a valid batch of distinct maximum-length names (unbounded interning?). */
	memset(buf, 0, sizeof(buf));
	h->magic = SLOWRANK_BATCH_MAGIC;
	h->version = SLOWRANK_ABI_VERSION;
	h->pid = (uint32_t)getpid();
	h->seq = ++seq;
	h->header_size = sizeof(*h);
	uint32_t off = sizeof(*h), count = 0;
	uint32_t rsize = (16 + SLOWRANK_NAME_MAX + 7) & ~7u;
	while (off + rsize <= SLOWRANK_BATCH_MAX) {
		struct slowrank_name_record *r = (void *)(buf + off);
		r->kind = SLOWRANK_REC_NAME;
		r->size = (uint16_t)rsize;
		r->len = SLOWRANK_NAME_MAX;
		r->name_id = next_name++;
		char *name = (char *)r + 16;
		memset(name, 'k', SLOWRANK_NAME_MAX);
		snprintf(name, 24, "%u-%u", (unsigned)getpid(), r->name_id);
		name[strlen(name)] = 'k';
		off += rsize;
		count++;
	}
	h->count = count;
	h->total_len = off;
	emit(buf, off);
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: injectee LIB MS [hostile|launch]\n");
		return 2;
	}
	int ms = atoi(argv[2]);
	int bad = argc > 3 && strcmp(argv[3], "hostile") == 0;
	fakecupti_launch_fn launch = NULL;
	if (argc > 3 && strcmp(argv[3], "launch") == 0) {
		const char *fake = getenv("SLOWRANK_CUPTI_LIB");
		void *f = fake ? dlopen(fake, RTLD_NOW | RTLD_LOCAL) : NULL;
		launch = f ? (fakecupti_launch_fn)dlsym(f, "fakecupti_launch") : NULL;
		if (!launch) {
			fprintf(stderr, "launch: SLOWRANK_CUPTI_LIB must name the fake libcupti (%s)\n",
				f ? "no fakecupti_launch" : dlerror());
			return 1;
		}
	}
	void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		fprintf(stderr, "dlopen: %s\n", dlerror());
		return 1;
	}
	int (*init)(void) = (int (*)(void))dlsym(h, "InitializeInjection");
	void (*emit)(const void *, uint32_t) = (void (*)(const void *, uint32_t))dlsym(h, SLOWRANK_SYM_EMIT);
	volatile uint16_t *sem = dlsym(h, SLOWRANK_SYM_SEMAPHORE);
	struct slowrank_cupti_control *ctl = dlsym(h, SLOWRANK_SYM_CONTROL);
	if (!init || !emit || !sem || !ctl) {
		fprintf(stderr, "missing symbols\n");
		return 1;
	}
	if (init() != 1) {
		fprintf(stderr, "InitializeInjection failed\n");
		return 1;
	}
	unsigned rnd = (unsigned)getpid();
	uint64_t start = now_ns(), last_print = 0, worst = 0;
	uint64_t end = start + (uint64_t)ms * 1000000ull;
	for (;;) {
		uint64_t t0 = now_ns();
		if (t0 >= end)
			break;
		if (bad && *sem)
			hostile(emit, &rnd);
		if (launch) /* CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, 100 us */
			launch(10, "injectee_kernel", 100000, (uint32_t)(t0 / 1000));
		struct timespec ts = {0, 5000000};
		nanosleep(&ts, NULL);
		uint64_t late = now_ns() - t0;
		late = late > 5000000 ? late - 5000000 : 0;
		if (late > worst)
			worst = late;
		if (t0 - last_print >= 50000000ull) {
			last_print = t0;
			printf("{\"t_ms\":%llu,\"sem\":%u,\"state\":%u,\"generation\":%u,\"applied\":%u,"
			       "\"max_late_us\":%llu,\"records\":%llu,\"yields\":%u,\"ctl_tid\":%u}\n",
			       (unsigned long long)((t0 - start) / 1000000), (unsigned)*sem,
			       __atomic_load_n(&ctl->state, __ATOMIC_RELAXED),
			       __atomic_load_n(&ctl->generation, __ATOMIC_RELAXED),
			       __atomic_load_n(&ctl->applied_generation, __ATOMIC_RELAXED),
			       (unsigned long long)(worst / 1000),
			       (unsigned long long)__atomic_load_n(&ctl->records, __ATOMIC_RELAXED),
			       __atomic_load_n(&ctl->yields, __ATOMIC_RELAXED),
			       __atomic_load_n(&ctl->ctl_tid, __ATOMIC_RELAXED));
			fflush(stdout);
			worst = 0;
		}
	}
	return 0;
}
