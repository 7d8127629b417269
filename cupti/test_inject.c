//go:build ignore

/*
 * test_inject.c - loads libslowrank_cupti.so without a GPU, as the CUDA driver
 * would, and checks that InitializeInjection returns cleanly and the process
 * runs on, in every scenario that can happen on a host:
 *   plain     libcupti present or not; no agent: collection stays off
 *   nolib     SLOWRANK_CUPTI_LIB points nowhere: inactive, still fine
 *   attach    the semaphore is raised as the kernel does for an attached
 *             uprobe; without a driver CUPTI refuses and the library backs off
 *   control   the agent's seqlock protocol on the control block is applied
 *   disabled  SLOWRANK_CUPTI_DISABLE=1
 *   dump      SLOWRANK_CUPTI_DUMP appends the batches to a file of its own
 *   dump_symlink, dump_hardlink, dump_dirlink
 *             SLOWRANK_CUPTI_DUMP at a symbolic link, a hard link of another
 *             file, or through a linked directory: refused with a line on
 *             stderr, the other file untouched
 * Each scenario runs in its own child process (InitializeInjection runs once
 * per process) with a deadline, so a hang or a crash fails the test.
 *
 * Usage: test_inject PATH/libslowrank_cupti.so
 */
#define _GNU_SOURCE
#include "slowrank_abi.h"
#include "test_clock.h"

#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const char *lib;

struct syms {
	int (*init)(void);
	void (*emit)(const void *, uint32_t);
	volatile uint16_t *sem;
	struct slowrank_cupti_control *ctl;
};

#define FAIL(...)                                        \
	do {                                             \
		fprintf(stderr, "  FAIL: " __VA_ARGS__); \
		fprintf(stderr, "\n");                   \
		_exit(1);                                \
	} while (0)

static uint32_t load32(const uint32_t *p)
{
	return __atomic_load_n(p, __ATOMIC_RELAXED);
}

static uint64_t load64(const uint64_t *p)
{
	return __atomic_load_n(p, __ATOMIC_RELAXED);
}

#define STORE(field, v) __atomic_store_n(&(field), (v), __ATOMIC_RELAXED)

static struct syms open_lib(void)
{
	struct syms s;
	void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
	if (!h)
		FAIL("dlopen %s: %s", lib, dlerror());
	*(void **)&s.init = dlsym(h, "InitializeInjection");
	*(void **)&s.emit = dlsym(h, SLOWRANK_SYM_EMIT);
	s.sem = dlsym(h, SLOWRANK_SYM_SEMAPHORE);
	s.ctl = dlsym(h, SLOWRANK_SYM_CONTROL);
	if (!s.init || !s.emit || !s.sem || !s.ctl)
		FAIL("missing exported symbol");
	/* Nothing else is exported. */
	if (dlsym(h, "slowrank_convert_buffer") || dlsym(h, "slowrank_conv_new"))
		FAIL("internal symbols are exported");
	if (s.ctl->magic != SLOWRANK_CONTROL_MAGIC || s.ctl->version != SLOWRANK_CONTROL_VERSION ||
	    s.ctl->size != sizeof(struct slowrank_cupti_control))
		FAIL("control block header: magic %#x version %u size %u", s.ctl->magic, s.ctl->version, s.ctl->size);
	if (s.ctl->mode != SLOWRANK_DEFAULT_MODE || s.ctl->period_ms != SLOWRANK_DEFAULT_PERIOD_MS)
		FAIL("control block defaults");
	if (*s.sem != 0)
		FAIL("semaphore starts at %u", *s.sem);
	return s;
}

/* Waits until pred holds or ms pass. */
#define WAIT_FOR(pred, ms)                               \
	({                                               \
		int ok_ = 0;                             \
		for (int i_ = 0; i_ < (ms) / 10; i_++) { \
			if (pred) {                      \
				ok_ = 1;                 \
				break;                   \
			}                                \
			sleep_ms(10);                    \
		}                                        \
		ok_;                                     \
	})

static void scenario_plain(void)
{
	struct syms s = open_lib();
	if (s.init() != 1)
		FAIL("InitializeInjection != 1");
	if (s.init() != 1)
		FAIL("second InitializeInjection != 1");
	if (!WAIT_FOR(load32(&s.ctl->state) == SLOWRANK_STATE_IDLE ||
			      load32(&s.ctl->state) == SLOWRANK_STATE_UNAVAILABLE,
		      2000))
		FAIL("state %u", load32(&s.ctl->state));
	if (!(load32(&s.ctl->status_flags) & SLOWRANK_STATUS_THREAD_ALIVE))
		FAIL("control thread not alive");
	uint64_t hb = __atomic_load_n(&s.ctl->heartbeat_ns, __ATOMIC_RELAXED);
	if (!WAIT_FOR(__atomic_load_n(&s.ctl->heartbeat_ns, __ATOMIC_RELAXED) > hb, 500))
		FAIL("heartbeat does not advance (poll period > 50 ms?)");
	sleep_ms(200);
	/* No agent: nothing was enabled or emitted. */
	if (load64(&s.ctl->enables) != 0 || load64(&s.ctl->batches) != 0 || load64(&s.ctl->records) != 0)
		FAIL("collected without an agent");
	if (load32(&s.ctl->status_flags) & SLOWRANK_STATUS_CUPTI_READY)
		FAIL("CUPTI initialised without an agent");
	s.emit(NULL, 0); /* the hand-off is callable and inert */
	printf("  state %u flags %#x cupti_version %u\n", load32(&s.ctl->state), load32(&s.ctl->status_flags),
	       load32(&s.ctl->cupti_version));
}

static void scenario_nolib(void)
{
	setenv("SLOWRANK_CUPTI_LIB", "/nonexistent/libcupti.so", 1);
	struct syms s = open_lib();
	if (s.init() != 1)
		FAIL("InitializeInjection != 1");
	if (!WAIT_FOR(load32(&s.ctl->state) == SLOWRANK_STATE_UNAVAILABLE, 2000))
		FAIL("state %u, want unavailable", load32(&s.ctl->state));
	/* An agent attaching changes nothing. */
	__atomic_store_n(s.sem, 1, __ATOMIC_RELAXED);
	sleep_ms(150);
	if (load32(&s.ctl->state) != SLOWRANK_STATE_UNAVAILABLE)
		FAIL("state %u after attach", load32(&s.ctl->state));
	__atomic_store_n(s.sem, 0, __ATOMIC_RELAXED);
	sleep_ms(100);
}

static void scenario_attach(void)
{
	struct syms s = open_lib();
	if (s.init() != 1)
		FAIL("InitializeInjection != 1");
	if (!WAIT_FOR(load32(&s.ctl->state) != SLOWRANK_STATE_INIT, 2000))
		FAIL("library never started");
	/* What the kernel does when a uprobe with ref_ctr_offset attaches. */
	__atomic_add_fetch(s.sem, 1, __ATOMIC_RELAXED);
	/* The library waits for the agent's decision about other CUPTI clients. */
	if (!WAIT_FOR(load32(&s.ctl->status_flags) & SLOWRANK_STATUS_WAITING, 2000))
		FAIL("attach not seen: flags %#x", load32(&s.ctl->status_flags));
	sleep_ms(100);
	if (load64(&s.ctl->enables) != 0)
		FAIL("CUPTI used before the agent's decision");
	STORE(s.ctl->cupti_gen, load32(&s.ctl->cupti_gen) + 1);
	/* Without a GPU driver CUPTI refuses; with one (GPU host) it would run. */
	if (!WAIT_FOR(load32(&s.ctl->state) == SLOWRANK_STATE_REFUSED ||
			      load32(&s.ctl->state) == SLOWRANK_STATE_UNAVAILABLE ||
			      load32(&s.ctl->state) == SLOWRANK_STATE_ON ||
			      load32(&s.ctl->state) == SLOWRANK_STATE_OFF_PHASE,
		      3000))
		FAIL("no reaction to the semaphore: state %u", load32(&s.ctl->state));
	printf("  attached: state %u last_error %d\n", load32(&s.ctl->state),
	       (int)load32((const uint32_t *)&s.ctl->last_error));
	sleep_ms(100);
	__atomic_sub_fetch(s.sem, 1, __ATOMIC_RELAXED);
	if (!WAIT_FOR(load32(&s.ctl->state) == SLOWRANK_STATE_IDLE ||
			      load32(&s.ctl->state) == SLOWRANK_STATE_UNAVAILABLE,
		      1000))
		FAIL("detach not seen within 1 s: state %u", load32(&s.ctl->state));
	/* Attach again: retried, still no crash. */
	__atomic_add_fetch(s.sem, 1, __ATOMIC_RELAXED);
	sleep_ms(200);
	__atomic_sub_fetch(s.sem, 1, __ATOMIC_RELAXED);
	sleep_ms(100);
}

static void scenario_control(void)
{
	struct syms s = open_lib();
	if (s.init() != 1)
		FAIL("InitializeInjection != 1");
	struct slowrank_cupti_control *c = s.ctl;
	/* A half-written update (odd generation) is not applied. */
	__atomic_store_n(&c->generation, 1, __ATOMIC_RELEASE);
	STORE(c->mode, SLOWRANK_DUTY_ALWAYS);
	sleep_ms(150);
	if (load32(&c->applied_generation) != 0)
		FAIL("applied an odd generation");
	STORE(c->on_ms, 0);
	STORE(c->period_ms, 0);
	__atomic_store_n(&c->generation, 2, __ATOMIC_RELEASE);
	if (!WAIT_FOR(load32(&c->applied_generation) == 2, 200))
		FAIL("generation 2 not applied within 200 ms");
	/* STEPS mode with the agent writing `step`. */
	__atomic_store_n(&c->generation, 3, __ATOMIC_RELEASE);
	STORE(c->mode, SLOWRANK_DUTY_STEPS);
	STORE(c->k_steps, 1);
	STORE(c->n_steps, 10);
	STORE(c->escalate_until_ns, 0);
	__atomic_store_n(&c->generation, 4, __ATOMIC_RELEASE);
	__atomic_store_n(&c->step, 41, __ATOMIC_RELAXED);
	if (!WAIT_FOR(load32(&c->applied_generation) == 4, 200))
		FAIL("generation 4 not applied within 200 ms");
}

static void scenario_disabled(void)
{
	setenv("SLOWRANK_CUPTI_DISABLE", "1", 1);
	struct syms s = open_lib();
	if (s.init() != 1)
		FAIL("InitializeInjection != 1");
	sleep_ms(100);
	if (load32(&s.ctl->state) != SLOWRANK_STATE_DISABLED)
		FAIL("state %u, want disabled", load32(&s.ctl->state));
	if (load32(&s.ctl->status_flags) & SLOWRANK_STATUS_THREAD_ALIVE)
		FAIL("thread started although disabled");
}

/* A directory of the scenario's own, and stderr into a file in it. */
static char dump_dir[64];

static void dump_setup(void)
{
	strcpy(dump_dir, "/tmp/sr-test-dump-XXXXXX");
	if (!mkdtemp(dump_dir))
		FAIL("mkdtemp");
	char p[128];
	snprintf(p, sizeof(p), "%s/stderr", dump_dir);
	if (!freopen(p, "w", stderr))
		FAIL("stderr to %s", p);
	setenv("SLOWRANK_CUPTI_LIB", "/nonexistent/libcupti.so", 1); /* the same batches wherever it runs */
}

/* Removes what the dump scenarios made. */
static void dump_cleanup(void)
{
	const char *names[] = {"own.dump", "victim", "link", "hard", "dirlink", "stderr"};
	char p[128];
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		snprintf(p, sizeof(p), "%s/%s", dump_dir, names[i]);
		unlink(p);
	}
	rmdir(dump_dir);
}

static long file_size(const char *dir, const char *name)
{
	char p[160];
	snprintf(p, sizeof(p), "%s/%s", dir, name);
	FILE *f = fopen(p, "r");
	if (!f)
		return -1;
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fclose(f);
	return n;
}

/* Raises the semaphore (an attach emits a batch) and waits for one. */
static void attach_and_emit(void)
{
	struct syms s = open_lib();
	if (s.init() != 1)
		FAIL("InitializeInjection != 1");
	__atomic_store_n(s.sem, 1, __ATOMIC_RELAXED);
	if (!WAIT_FOR(load64(&s.ctl->batches) > 0, 2000))
		FAIL("no batch after the attach");
	sleep_ms(50);
	__atomic_store_n(s.sem, 0, __ATOMIC_RELAXED);
}

static void scenario_dump(void)
{
	dump_setup();
	char p[128];
	snprintf(p, sizeof(p), "%s/own.dump", dump_dir);
	setenv("SLOWRANK_CUPTI_DUMP", p, 1);
	attach_and_emit();
	if (file_size(dump_dir, "own.dump") <= 0)
		FAIL("nothing dumped to %s", p);
	dump_cleanup();
}

/* SLOWRANK_CUPTI_DUMP at name, planted by another user to reach victim. */
static void dump_refused(const char *name)
{
	dump_setup();
	char victim[128], p[160];
	snprintf(victim, sizeof(victim), "%s/victim", dump_dir);
	FILE *f = fopen(victim, "w");
	if (!f || fputs("keep\n", f) < 0 || fclose(f) != 0)
		FAIL("write %s", victim);
	snprintf(p, sizeof(p), "%s/link", dump_dir);
	if (symlink(victim, p) != 0)
		FAIL("symlink");
	snprintf(p, sizeof(p), "%s/hard", dump_dir);
	if (link(victim, p) != 0)
		FAIL("link");
	snprintf(p, sizeof(p), "%s/dirlink", dump_dir);
	if (symlink(dump_dir, p) != 0)
		FAIL("symlink");
	snprintf(p, sizeof(p), "%s/%s", dump_dir, name);
	setenv("SLOWRANK_CUPTI_DUMP", p, 1);
	attach_and_emit();
	fflush(stderr);
	if (file_size(dump_dir, "victim") != 5)
		FAIL("SLOWRANK_CUPTI_DUMP=%s wrote into another file (%ld bytes)", name, file_size(dump_dir, "victim"));
	char log[4096] = {0};
	snprintf(p, sizeof(p), "%s/stderr", dump_dir);
	f = fopen(p, "r");
	if (!f || fread(log, 1, sizeof(log) - 1, f) == 0 || !strstr(log, "SLOWRANK_CUPTI_DUMP=") ||
	    !strstr(log, "refused"))
		FAIL("no refusal on stderr for %s: %s", name, log);
	if (f)
		fclose(f);
	printf("  %s: %s", name, log);
	dump_cleanup();
}

static void scenario_dump_symlink(void)
{
	dump_refused("link");
}

static void scenario_dump_hardlink(void)
{
	dump_refused("hard");
}

static void scenario_dump_dirlink(void)
{
	dump_refused("dirlink/victim");
}

static int run(const char *name, void (*fn)(void))
{
	printf("--- %s\n", name);
	fflush(stdout);
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	pid_t pid = fork();
	if (pid == 0) {
		alarm(10);
		fn();
		/* Leave through exit(): atexit + destructor must not hang. */
		exit(0);
	}
	int st = 0;
	waitpid(pid, &st, 0);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
	if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
		printf("ok   %s (%.2fs)\n", name, secs);
		return 1;
	}
	if (WIFSIGNALED(st))
		printf("FAIL %s: signal %d (%s)\n", name, WTERMSIG(st), strsignal(WTERMSIG(st)));
	else
		printf("FAIL %s: exit %d\n", name, WEXITSTATUS(st));
	return 0;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: test_inject LIB\n");
		return 2;
	}
	lib = argv[1];
	unsetenv("SLOWRANK_CUPTI_FORCE_ATTACH");
	unsetenv("SLOWRANK_CUPTI_MODE");
	unsetenv("SLOWRANK_CUPTI_DISABLE");
	unsetenv("SLOWRANK_CUPTI_LIB");
	struct {
		const char *name;
		void (*fn)(void);
	} sc[] = {
		{"plain", scenario_plain},
		{"nolib", scenario_nolib},
		{"attach", scenario_attach},
		{"control", scenario_control},
		{"disabled", scenario_disabled},
		{"dump", scenario_dump},
		{"dump_symlink", scenario_dump_symlink},
		{"dump_hardlink", scenario_dump_hardlink},
		{"dump_dirlink", scenario_dump_dirlink},
	};
	int passed = 0, failed = 0;
	for (size_t i = 0; i < sizeof(sc) / sizeof(sc[0]); i++) {
		if (run(sc[i].name, sc[i].fn))
			passed++;
		else
			failed++;
	}
	printf("%d passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}
