//go:build ignore

/*
 * slowrank_cupti.c - the CUPTI injection library (libslowrank_cupti.so).
 *
 * Loaded by the CUDA driver through CUDA_INJECTION64_PATH, which calls
 * InitializeInjection() from cuInit. The library:
 *   - never links libcupti: it dlopens it, so it loads on any host;
 *   - does nothing CUPTI-related until an agent attaches its uprobe on
 *     slowrank_cupti_emit (the kernel then raises slowrank_cupti_semaphore)
 *     and has decided whether another CUPTI client is active (Yield in
 *     slowrank_abi.h): it never takes CUPTI from Kineto or nsys, and a
 *     client that registered its callbacks just as the library took CUPTI
 *     gets them back when it yields (Handback in slowrank_abi.h);
 *   - while attached, follows the duty cycle in slowrank_cupti_control,
 *     enabling CONCURRENT_KERNEL + MEMCPY + MEMSET for on-phases only;
 *   - never frees or unmaps a buffer it gave CUPTI: buffers are private
 *     anonymous mappings for the life of the process, released to the
 *     kernel with MADV_DONTNEED when idle, so a late write can only fault
 *     in a zero page;
 *   - makes no CUPTI call from exit handlers (CUPTI may be torn down first);
 *   - converts completed CUPTI buffers into batches (slowrank_abi.h) and hands
 *     each to slowrank_cupti_emit(), the only hand-off (BPF copies the bytes);
 *   - never aborts, blocks the application or prints more than one status
 *     line (SLOWRANK_CUPTI_DEBUG=1 prints more).
 *
 * Environment:
 *   SLOWRANK_CUPTI_DISABLE=1      do nothing at all
 *   SLOWRANK_CUPTI_LIB=PATH       use exactly this libcupti
 *   SLOWRANK_CUPTI_DEBUG=1        verbose stderr (attach, transitions, exit counters)
 *   SLOWRANK_CUPTI_QUIET=1        not even the status line
 *   SLOWRANK_CUPTI_BUFFERS=N      buffer pool size (2..64, default 8)
 *   SLOWRANK_CUPTI_BUFFER_KB=K    buffer size in KiB (64..8192, default 1024)
 *   SLOWRANK_CUPTI_FORCE_ATTACH=1 behave as if an agent were attached (validation only)
 *   SLOWRANK_CUPTI_MODE=always|off|time:ON_MS:PERIOD_MS   initial duty mode (validation only)
 *   SLOWRANK_CUPTI_DUMP=PATH      append every batch as [u32 len][bytes] to PATH (validation only;
 *                                 no symbolic link in PATH, a regular file of this user: open_dump)
 *
 * The same file is NCCL's profiler plugin (slowrank_nccl.c): NCCL's first
 * init of it starts the control thread when the CUDA driver has not (yet)
 * called InitializeInjection; CUPTI is loaded only once it has.
 */
#define _GNU_SOURCE
#include "slowrank_convert.h"
#include "slowrank_nccl.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <limits.h>
#include <link.h>
#include <linux/openat2.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define SR_EXPORT __attribute__((visibility("default")))
#if defined(__GNUC__) && !defined(__clang__)
#define SR_NOIPA __attribute__((noipa))
#else
#define SR_NOIPA
#endif

/* ---------------------------------------------------------------------- */
/* Exported ABI                                                            */
/* ---------------------------------------------------------------------- */

/* Uprobe reference counter (ref_ctr_offset): non-zero exactly while an agent's
 * uprobe on slowrank_cupti_emit is attached. Lives in .probes, like USDT
 * semaphores, so it is file-backed and easy to locate. */
SR_EXPORT __attribute__((section(".probes"), used)) volatile uint16_t slowrank_cupti_semaphore;

/* Duty-cycle control and status, see slowrank_abi.h. */
SR_EXPORT __attribute__((used, aligned(64))) struct slowrank_cupti_control slowrank_cupti_control = {
	.magic = SLOWRANK_CONTROL_MAGIC,
	.version = SLOWRANK_CONTROL_VERSION,
	.size = sizeof(struct slowrank_cupti_control),
	.mode = SLOWRANK_DEFAULT_MODE,
	.on_ms = SLOWRANK_DEFAULT_ON_MS,
	.period_ms = SLOWRANK_DEFAULT_PERIOD_MS,
};

/* The other client's callbacks as the agent saw them, and what the library
 * did with them (Handback in slowrank_abi.h). */
SR_EXPORT __attribute__((used, aligned(64))) struct slowrank_cupti_handback slowrank_cupti_handback = {
	.magic = SLOWRANK_HANDBACK_MAGIC,
	.version = SLOWRANK_HANDBACK_VERSION,
	.size = sizeof(struct slowrank_cupti_handback),
};

/* The hand-off: the agent uprobes this function and copies `len` bytes from
 * `batch`. Deliberately empty; the barrier keeps calls from being elided. */
SR_EXPORT __attribute__((noinline, used)) SR_NOIPA void slowrank_cupti_emit(const void *batch, uint32_t len)
{
	__asm__ __volatile__("" : : "r"(batch), "r"(len) : "memory");
}

SR_EXPORT int InitializeInjection(void);

/* ---------------------------------------------------------------------- */
/* CUPTI entry points (resolved with dlsym)                                */
/* ---------------------------------------------------------------------- */

typedef uint64_t (*sr_ts_fn)(void);
typedef void (*sr_cb_fn)(void *, CUpti_CallbackDomain, CUpti_CallbackId, const void *);

struct cupti_api {
	void *handle;
	char path[PATH_MAX];
	uint32_t version;
	CUptiResult (*GetVersion)(uint32_t *);
	CUptiResult (*GetResultString)(CUptiResult, const char **);
	CUptiResult (*Subscribe)(CUpti_SubscriberHandle *, sr_cb_fn, void *);
	CUptiResult (*Unsubscribe)(CUpti_SubscriberHandle);
	CUptiResult (*ActivityRegisterCallbacks)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc);
	CUptiResult (*ActivityEnable)(CUpti_ActivityKind);
	CUptiResult (*ActivityDisable)(CUpti_ActivityKind);
	CUptiResult (*ActivityFlushAll)(uint32_t);
	CUptiResult (*ActivityGetNextRecord)(uint8_t *, size_t, CUpti_Activity **);
	CUptiResult (*ActivityGetNumDroppedRecords)(CUcontext, uint32_t, size_t *);
	CUptiResult (*GetTimestamp)(uint64_t *);
	CUptiResult (*ActivityRegisterTimestampCallback)(sr_ts_fn); /* optional (CUDA >= 12.x) */
};

static const CUpti_ActivityKind sr_kinds[] = {
	CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, /* never CUPTI_ACTIVITY_KIND_KERNEL: it serialises */
	CUPTI_ACTIVITY_KIND_MEMCPY,
	CUPTI_ACTIVITY_KIND_MEMSET,
};
#define SR_NKINDS (sizeof(sr_kinds) / sizeof(sr_kinds[0]))

/* ---------------------------------------------------------------------- */
/* State                                                                   */
/* ---------------------------------------------------------------------- */

#define SR_POLL_NS (50ull * 1000000ull)
#define SR_FLUSH_NS (100ull * 1000000ull)
#define SR_STATS_NS (1000ull * 1000000ull)
#define SR_CALIB_NS (1000ull * 1000000ull)
#define SR_EXIT_WAIT_NS (300ull * 1000000ull)
#define SR_HAND_BACK_NS (50ull * 1000000ull)
/* After collection goes off, the records of work the host had queued ahead
 * of the GPU complete only once that work has run (a whole step and more on
 * a GPU-bound job): buffers are taken back by normal flushes until none is
 * outstanding, and by force (their incomplete records lost, counted) only
 * once this long has passed since the disable. */
#define SR_DRAIN_MAX_NS (3000ull * 1000000ull)
#define SR_SUSPECT_NS (500ull * 1000000ull)
#define SR_ON_POLL_NS (2ull * 1000000ull)
/* Collection time after a (re)registration in which CUPTI must ask for a
 * buffer at least once; if it never does, its records go to another
 * client's callbacks (seen on CUDA 13.0 after a torch.profiler session that
 * ran before this library's first use of CUPTI): collection stops. */
#define SR_NO_BUFFER_NS (30ull * 1000000000ull)
#define SR_POOL_MAX 64
/* Another client's buffers completed to this library's callbacks, held
 * until the agent says whose they are (Handback). */
#define SR_PARK_MAX 32
/* After a yield starts (and whenever the agent writes again meanwhile), poll
 * every millisecond for this long: the other client's callbacks may follow
 * the yield decision. */
#define SR_HANDBACK_POLL_NS (50ull * 1000000ull)
/* Attached and waiting for the agent's first yield decision: poll every
 * millisecond for SR_WAIT_FAST_NS (the agent decides within one of its
 * 200-ms ticks of the attach, and a client that starts between its decision
 * and this library's registration would lose its callbacks to it), then
 * back off, doubling the interval up to SR_WAIT_POLL_MAX_NS. An agent that
 * attached but never decides (the process is over its quota, found while
 * paused, another agent's, or its memory not writable) then costs five
 * wake-ups a second, not a thousand; a late decision is acted on within one
 * interval, never longer than the wait so far. An agent that is gone drops
 * the semaphore (the kernel removes the uprobe with its last link, also
 * after SIGKILL): on_detach ends the wait. */
#define SR_WAIT_FAST_NS (500ull * 1000000ull)
#define SR_WAIT_POLL_MAX_NS (200ull * 1000000ull)

struct pool_slot {
	_Atomic int given;    /* 1 while CUPTI holds it */
	_Atomic int orphan;   /* given before another client took CUPTI: may never come back */
	uint8_t *_Atomic mem; /* mapped once, never unmapped */
};

/* A buffer of another client, completed to this library's callbacks. */
struct parked_buffer {
	CUcontext ctx;
	uint32_t stream;
	uint8_t *buffer;
	size_t size, valid;
};

struct duty_cfg {
	uint32_t mode, on_ms, period_ms, k_steps, n_steps, name_resend, agent_flags;
	int64_t phase_offset_ns;
	uint64_t escalate_until_ns;
};

static struct {
	_Atomic int initialized;
	_Atomic int cupti_wanted; /* InitializeInjection ran: the CUDA driver loaded us */
	int cupti_tried;          /* control thread: load_cupti() was attempted */
	int nccl_resend;          /* control thread: re-send NCCL communicators (new epoch) */
	uint64_t last_nccl_flush, last_rt_calib;
	int disabled;
	int debug;
	int quiet;
	int force_attach;
	pid_t pid;
	_Atomic int forked_child;

	struct cupti_api api;
	int loaded;
	int ready;                      /* callbacks registered */
	int refused;                    /* CUPTI refused during this attach epoch */
	int waiting;                    /* attached, the agent has not decided about other CUPTI clients yet */
	uint64_t wait_since, wait_poll; /* the wait's start and poll interval (SR_WAIT_*) */
	uint32_t seen_cupti_gen;
	int yielded; /* another CUPTI client is active: no CUPTI calls */
	uint64_t yield_since;
	int need_setup; /* callbacks and clock must be registered (again) */
	uint64_t last_disable_ns;
	uint64_t fast_until;    /* poll every 1 ms until then: a toggle may have raced another client */
	uint64_t hand_back_at;  /* forced flush due: CUPTI keeps no buffer of ours while off */
	uint64_t suspect_until; /* signs of another client: no CUPTI call until then (the agent decides) */
	uint64_t own_reg_end;   /* CLOCK_MONOTONIC when this library's last cuptiActivityRegisterCallbacks returned */
	uint64_t own_ts_end;    /* ... and its last cuptiActivityRegisterTimestampCallback */
	/* Handback, per yield: what was given back to the other client */
	uint64_t hb_pair_seen, hb_ts_seen; /* pair_ns / timestamp_ns already acted on */
	int hb_pair_known;                 /* a pair of the other client's current session was seen */
	uint64_t hb_since;                 /* foreign_since_ns of the yield (the agent clears it when the yield ends) */
	uint64_t hb_kinds_on;              /* bit per kind of sr_kinds: on for the other client now */
	pthread_mutex_t park_mu;
	CUpti_BuffersCallbackCompleteFunc fwd_complete; /* guarded by park_mu: where parked buffers go */
	struct parked_buffer park[SR_PARK_MAX];
	int npark;
	uint64_t requested_at_setup; /* c_requested when the callbacks were last registered */
	uint64_t on_ns_at_setup;     /* c_on_ns then */
	_Atomic int foreign_clock;   /* records on another clock seen: re-register ours */
	int refusal_printed;
	int on; /* kinds enabled */
	int attached;
	uint64_t on_since;
	int ts_callback;

	/* conversion (guarded by mu) */
	pthread_mutex_t mu;
	struct slowrank_conv *conv;
	uint64_t mono0, tsc0; /* at InitializeInjection: the TSC's rate */
	int dump_fd;

	/* buffer pool (lock-free for bufferRequested) */
	struct pool_slot pool[SR_POOL_MAX];
	int npool;
	size_t bufsize;
	_Atomic int pool_keep;
	_Atomic int convert_on; /* completed buffers are converted (attached) */

	/* runtime counters, merged into stats records */
	_Atomic uint64_t c_requested, c_refused, c_completed, c_flushes, c_enables, c_attaches, c_cupti_errors, c_on_ns,
		c_discarded, c_yields, c_yielded_ns, c_orphaned, c_lease, c_rejected, c_reenabled, c_setups,
		c_foreign_buffers, c_handbacks, c_clock_handbacks, c_forwarded, c_taken, c_hb_rejected;

	/* control thread */
	pthread_t thread;
	pthread_mutex_t ctl_mu;
	pthread_cond_t ctl_cond;
	int thread_started;
	int exit_requested;
	int exit_done;

	/* duty config */
	struct duty_cfg cfg;
	uint32_t applied_generation;
	uint64_t generation_since; /* CLOCK_MONOTONIC of the last generation change (the lease) */
	int lease_expired;
	uint32_t rejected_generation;
	uint32_t last_resend;
	uint64_t last_flush, last_stats, last_calib;
	int32_t last_error;
} g = {
	.mu = PTHREAD_MUTEX_INITIALIZER,
	.ctl_mu = PTHREAD_MUTEX_INITIALIZER,
	.park_mu = PTHREAD_MUTEX_INITIALIZER,
	.dump_fd = -1,
};

/* Poll every millisecond until at least t. */
static void fast_poll_until(uint64_t t)
{
	if (t > g.fast_until)
		g.fast_until = t;
}

static uint64_t mono_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The time-stamp counter (Kineto's clock on x86 and arm64), 0 elsewhere. */
static uint64_t tsc_now(void)
{
#if defined(__x86_64__)
	return __builtin_ia32_rdtsc();
#elif defined(__aarch64__)
	uint64_t v;
	__asm__ __volatile__("mrs %0, cntvct_el0" : "=r"(v));
	return v;
#else
	return 0;
#endif
}

static uint64_t real_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Timestamp callback for CUPTI: record timestamps in CLOCK_MONOTONIC. */
static uint64_t CUPTIAPI sr_timestamp(void)
{
	return mono_ns();
}

static void logline(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void logline(const char *fmt, ...)
{
	char buf[768];
	uint64_t now = g.debug ? mono_ns() : 0;
	int n = g.debug ? snprintf(buf, sizeof(buf), "slowrank-cupti: pid %d: %llu.%03llu: ", (int)getpid(),
				   (unsigned long long)(now / 1000000000ull),
				   (unsigned long long)(now / 1000000ull % 1000ull))
			: snprintf(buf, sizeof(buf), "slowrank-cupti: pid %d: ", (int)getpid());
	va_list ap;
	va_start(ap, fmt);
	if (n > 0 && (size_t)n < sizeof(buf))
		n += vsnprintf(buf + n, sizeof(buf) - (size_t)n, fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	if ((size_t)n >= sizeof(buf) - 1)
		n = (int)sizeof(buf) - 2;
	buf[n++] = '\n';
	ssize_t w = write(STDERR_FILENO, buf, (size_t)n);
	(void)w;
}

#define DEBUGF(...)                           \
	do {                                  \
		if (g.debug)                  \
			logline(__VA_ARGS__); \
	} while (0)

static const char *result_string(CUptiResult r)
{
	const char *s = NULL;
	if (g.api.GetResultString && g.api.GetResultString(r, &s) == CUPTI_SUCCESS && s)
		return s;
	return "CUPTI error";
}

static void set_state(uint32_t st)
{
	__atomic_store_n(&slowrank_cupti_control.state, st, __ATOMIC_RELAXED);
}

static void set_status_flag(uint32_t f, int on)
{
	if (on)
		__atomic_fetch_or(&slowrank_cupti_control.status_flags, f, __ATOMIC_RELAXED);
	else
		__atomic_fetch_and(&slowrank_cupti_control.status_flags, ~f, __ATOMIC_RELAXED);
}

static void cupti_error(const char *what, CUptiResult r)
{
	atomic_fetch_add(&g.c_cupti_errors, 1);
	g.last_error = (int32_t)r;
	__atomic_store_n(&slowrank_cupti_control.last_error, (int32_t)r, __ATOMIC_RELAXED);
	DEBUGF("%s: %s (%d)", what, result_string(r), (int)r);
}

/* ---------------------------------------------------------------------- */
/* Loading libcupti                                                        */
/* ---------------------------------------------------------------------- */

#define SR_SYM(field, name)                           \
	do {                                          \
		void *p_ = dlsym(h, name);            \
		memcpy(&api->field, &p_, sizeof(p_)); \
	} while (0)

static int bind_api(void *h, struct cupti_api *api)
{
	SR_SYM(GetVersion, "cuptiGetVersion");
	SR_SYM(GetResultString, "cuptiGetResultString");
	SR_SYM(Subscribe, "cuptiSubscribe");
	SR_SYM(Unsubscribe, "cuptiUnsubscribe");
	SR_SYM(ActivityRegisterCallbacks, "cuptiActivityRegisterCallbacks");
	SR_SYM(ActivityEnable, "cuptiActivityEnable");
	SR_SYM(ActivityDisable, "cuptiActivityDisable");
	SR_SYM(ActivityFlushAll, "cuptiActivityFlushAll");
	SR_SYM(ActivityGetNextRecord, "cuptiActivityGetNextRecord");
	SR_SYM(ActivityGetNumDroppedRecords, "cuptiActivityGetNumDroppedRecords");
	SR_SYM(GetTimestamp, "cuptiGetTimestamp");
	SR_SYM(ActivityRegisterTimestampCallback, "cuptiActivityRegisterTimestampCallback");
	return api->GetVersion && api->Subscribe && api->Unsubscribe && api->ActivityRegisterCallbacks &&
	       api->ActivityEnable && api->ActivityDisable && api->ActivityFlushAll && api->ActivityGetNextRecord &&
	       api->GetTimestamp;
}

static int try_open(const char *path)
{
	if (!path || !*path)
		return 0;
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		DEBUGF("dlopen %s: %s", path, dlerror());
		return 0;
	}
	struct cupti_api api;
	memset(&api, 0, sizeof(api));
	if (!bind_api(h, &api)) {
		DEBUGF("%s: missing CUPTI symbols", path);
		dlclose(h);
		return 0;
	}
	api.handle = h;
	snprintf(api.path, sizeof(api.path), "%s", path);
	/* Prefer the resolved file name for the status line. */
	struct link_map *lm = NULL;
	if (dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name && lm->l_name[0])
		snprintf(api.path, sizeof(api.path), "%s", lm->l_name);
	if (api.GetVersion(&api.version) != CUPTI_SUCCESS)
		api.version = 0;
	g.api = api;
	return 1;
}

static int try_glob(const char *pattern)
{
	glob_t gl;
	int ok = 0;
	if (glob(pattern, 0, NULL, &gl) != 0)
		return 0;
	for (size_t i = 0; i < gl.gl_pathc && !ok; i++)
		ok = try_open(gl.gl_pathv[i]);
	globfree(&gl);
	return ok;
}

struct loaded_paths {
	char cupti[PATH_MAX];
	char cudart_dir[PATH_MAX];
	char torch_dir[PATH_MAX];
};

static void set_dir(char *dst, const char *path)
{
	snprintf(dst, PATH_MAX, "%s", path);
	char *slash = strrchr(dst, '/');
	if (slash)
		*slash = 0;
	else
		dst[0] = 0;
}

static int phdr_cb(struct dl_phdr_info *info, size_t size, void *arg)
{
	(void)size;
	struct loaded_paths *lp = arg;
	const char *n = info->dlpi_name;
	if (!n || n[0] != '/')
		return 0;
	const char *base = strrchr(n, '/') + 1;
	if (!lp->cupti[0] && strncmp(base, "libcupti.so", 11) == 0)
		snprintf(lp->cupti, PATH_MAX, "%s", n);
	else if (!lp->cudart_dir[0] && strncmp(base, "libcudart.so", 12) == 0)
		set_dir(lp->cudart_dir, n);
	else if (!lp->torch_dir[0] && strncmp(base, "libtorch_cuda.so", 16) == 0)
		set_dir(lp->torch_dir, n);
	return 0;
}

static int try_dir_patterns(const char *dir, const char *const *rel)
{
	char pat[PATH_MAX + 64];
	for (; *rel; rel++) {
		snprintf(pat, sizeof(pat), "%s/%s", dir, *rel);
		if (try_glob(pat))
			return 1;
	}
	return 0;
}

static int load_cupti(void)
{
	const char *explicit_path = getenv("SLOWRANK_CUPTI_LIB");
	if (explicit_path && *explicit_path)
		return try_open(explicit_path);

	struct loaded_paths lp;
	memset(&lp, 0, sizeof(lp));
	dl_iterate_phdr(phdr_cb, &lp);
	/* 1. The libcupti already in the process (torch/Kineto links it). */
	if (lp.cupti[0] && try_open(lp.cupti))
		return 1;
	/* 2. The CUDA toolkit. */
	static const char *const toolkit[] = {"extras/CUPTI/lib64/libcupti.so*",
					      "targets/x86_64-linux/lib/libcupti.so*",
					      "targets/sbsa-linux/lib/libcupti.so*", "lib64/libcupti.so*", NULL};
	const char *homes[] = {getenv("CUDA_HOME"), getenv("CUDA_PATH"), "/usr/local/cuda"};
	for (size_t i = 0; i < sizeof(homes) / sizeof(homes[0]); i++)
		if (homes[i] && *homes[i] && try_dir_patterns(homes[i], toolkit))
			return 1;
	/* 3. The nvidia-cuda-cupti pip package next to the loaded libcudart/torch. */
	static const char *const pip_from_cudart[] = {"libcupti.so*", "../../cuda_cupti/lib/libcupti.so*",
						      "../../cu13/lib/libcupti.so*", "../../cu12/lib/libcupti.so*",
						      NULL};
	static const char *const pip_from_torch[] = {"libcupti.so*", "../../nvidia/cuda_cupti/lib/libcupti.so*",
						     "../../nvidia/cu13/lib/libcupti.so*",
						     "../../nvidia/cu12/lib/libcupti.so*", NULL};
	if (lp.cudart_dir[0] && try_dir_patterns(lp.cudart_dir, pip_from_cudart))
		return 1;
	if (lp.torch_dir[0] && try_dir_patterns(lp.torch_dir, pip_from_torch))
		return 1;
	/* 4. The dynamic linker's search path. */
	static const char *const sonames[] = {"libcupti.so", "libcupti.so.13", "libcupti.so.12", "libcupti.so.11.8",
					      NULL};
	for (const char *const *s = sonames; *s; s++)
		if (try_open(*s))
			return 1;
	return 0;
}

/* ---------------------------------------------------------------------- */
/* Buffers                                                                 */
/* ---------------------------------------------------------------------- */

/* A buffer for CUPTI: the slot's mapping, made on first use and kept for
 * the life of the process (never freed or unmapped: CUPTI's contract says
 * it no longer touches a completed buffer, and this makes even a broken
 * promise harmless). */
static uint8_t *slot_memory(struct pool_slot *sl)
{
	uint8_t *mem = atomic_load(&sl->mem);
	if (mem)
		return mem;
	void *p = mmap(NULL, g.bufsize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return NULL;
	atomic_store(&sl->mem, (uint8_t *)p);
	return p;
}

/* Buffers CUPTI holds that count against the pool (orphans do not). */
static int outstanding_buffers(void)
{
	int n = 0;
	for (int i = 0; i < SR_POOL_MAX; i++)
		n += atomic_load(&g.pool[i].given) && !atomic_load(&g.pool[i].orphan);
	return n;
}

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records)
{
	*buffer = NULL;
	*size = 0;
	*max_records = 0;
	atomic_fetch_add(&g.c_requested, 1);
	/* Up to npool buffers in flight; orphaned slots (lost to another
	 * client) are replaced from the spare slots, up to SR_POOL_MAX. */
	if (outstanding_buffers() < g.npool) {
		for (int i = 0; i < SR_POOL_MAX; i++) {
			struct pool_slot *sl = &g.pool[i];
			int expected = 0;
			if (!atomic_compare_exchange_strong(&sl->given, &expected, 1))
				continue;
			uint8_t *mem = slot_memory(sl);
			if (!mem) {
				atomic_store(&sl->given, 0);
				break;
			}
			*buffer = mem;
			*size = g.bufsize;
			return;
		}
	}
	/* Pool exhausted: CUPTI gets no buffer and counts the records it drops. */
	atomic_fetch_add(&g.c_refused, 1);
}

/* The pool slot of one of our buffers, NULL for another client's. */
static struct pool_slot *slot_of(const uint8_t *buffer)
{
	for (int i = 0; i < SR_POOL_MAX; i++)
		if (atomic_load(&g.pool[i].mem) == buffer)
			return &g.pool[i];
	return NULL;
}

/* Gives a buffer CUPTI handed back its slot again. */
static void release_buffer(struct pool_slot *sl)
{
	if (!atomic_load(&g.pool_keep))
		madvise(atomic_load(&sl->mem), g.bufsize, MADV_DONTNEED);
	atomic_store(&sl->orphan, 0);
	atomic_store(&sl->given, 0);
}

/* Gives idle buffers' memory back to the kernel; the mappings stay. */
static void release_idle_buffers(void)
{
	for (int i = 0; i < SR_POOL_MAX; i++) {
		struct pool_slot *sl = &g.pool[i];
		int expected = 0;
		if (!atomic_compare_exchange_strong(&sl->given, &expected, 1))
			continue;
		uint8_t *mem = atomic_load(&sl->mem);
		if (mem)
			madvise(mem, g.bufsize, MADV_DONTNEED);
		atomic_store(&sl->given, 0);
	}
}

/* Buffers CUPTI holds now may have gone to another client's callbacks (or
 * to nobody, after cuptiFinalize): they stop counting against the pool. */
static void orphan_outstanding(void)
{
	for (int i = 0; i < SR_POOL_MAX; i++) {
		struct pool_slot *sl = &g.pool[i];
		if (atomic_load(&sl->given) && !atomic_exchange(&sl->orphan, 1))
			atomic_fetch_add(&g.c_orphaned, 1);
	}
}

static int cupti_next(void *user, uint8_t *buf, size_t valid, CUpti_Activity **rec)
{
	(void)user;
	CUptiResult r = g.api.ActivityGetNextRecord(buf, valid, rec);
	if (r == CUPTI_SUCCESS)
		return SLOWRANK_NEXT_OK;
	if (r == CUPTI_ERROR_MAX_LIMIT_REACHED)
		return SLOWRANK_NEXT_END;
	return SLOWRANK_NEXT_ERROR;
}

/* Records further than this from now are on another client's clock
 * (Kineto's TSC ticks, CUPTI's default CLOCK_REALTIME). */
#define SR_CLOCK_PAST_NS (600ull * 1000000000ull)
#define SR_CLOCK_FUTURE_NS (60ull * 1000000000ull)

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size, size_t valid)
{
	(void)size;
	atomic_fetch_add(&g.c_completed, 1);
	struct pool_slot *sl = buffer ? slot_of(buffer) : NULL;
	if (buffer && !sl) {
		/* Another client's buffer, completed to us because our
		 * registration came after its own: its records and its memory
		 * are its own. Passed to its completion callback once the agent
		 * has said which that is (Handback), else held until then. */
		pthread_mutex_lock(&g.park_mu);
		CUpti_BuffersCallbackCompleteFunc f = g.fwd_complete;
		if (!f) {
			if (g.npark < SR_PARK_MAX)
				g.park[g.npark++] = (struct parked_buffer){ctx, stream, buffer, size, valid};
			else
				atomic_fetch_add(&g.c_foreign_buffers, 1);
		}
		pthread_mutex_unlock(&g.park_mu);
		if (f) {
			atomic_fetch_add(&g.c_forwarded, 1);
			f(ctx, stream, buffer, size, valid);
		}
		return;
	}
	if (buffer && valid > 0 && !atomic_load(&g.forked_child)) {
		pthread_mutex_lock(&g.mu);
		if (atomic_load(&g.convert_on) && g.conv) {
			uint64_t now = mono_ns();
			uint64_t before = slowrank_conv_counter(g.conv, SLOWRANK_STAT_FOREIGN_CLOCK);
			slowrank_conv_set_window(g.conv, now > SR_CLOCK_PAST_NS ? now - SR_CLOCK_PAST_NS : 1,
						 now + SR_CLOCK_FUTURE_NS);
			struct slowrank_clocks k = {.mono_ns = now, .real_ns = real_ns(), .tsc = tsc_now()};
			if (k.tsc > g.tsc0 && g.tsc0 != 0 && now - g.mono0 > 1000000000ull)
				k.tsc_per_ns = (double)(k.tsc - g.tsc0) / (double)(now - g.mono0);
			slowrank_conv_set_clocks(g.conv, &k);
			slowrank_convert_buffer(g.conv, buffer, valid, cupti_next, NULL);
			if (slowrank_conv_counter(g.conv, SLOWRANK_STAT_FOREIGN_CLOCK) != before)
				atomic_store(&g.foreign_clock, 1);
		} else {
			CUpti_Activity *rec = NULL;
			uint64_t n = 0;
			while (g.api.ActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS)
				n++;
			atomic_fetch_add(&g.c_discarded, n);
		}
		size_t dropped = 0;
		if (g.api.ActivityGetNumDroppedRecords &&
		    g.api.ActivityGetNumDroppedRecords(ctx, stream, &dropped) == CUPTI_SUCCESS && dropped && g.conv)
			slowrank_conv_add_cupti_dropped(g.conv, dropped);
		pthread_mutex_unlock(&g.mu);
	}
	if (sl)
		release_buffer(sl);
}

/* ---------------------------------------------------------------------- */
/* Emitting                                                                */
/* ---------------------------------------------------------------------- */

static void write_full(int fd, const void *p, size_t n)
{
	const uint8_t *b = p;
	while (n > 0) {
		ssize_t w = write(fd, b, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return;
		b += w;
		n -= (size_t)w;
	}
}

static void rt_emit(void *user, const void *batch, uint32_t len)
{
	(void)user;
	slowrank_cupti_emit(batch, len);
	if (g.dump_fd >= 0) {
		write_full(g.dump_fd, &len, sizeof(len));
		write_full(g.dump_fd, batch, len);
	}
}

/* Caller holds g.mu. */
static void sync_counters(void)
{
	struct slowrank_conv *c = g.conv;
	uint64_t on_ns = atomic_load(&g.c_on_ns);
	if (g.on)
		on_ns += mono_ns() - g.on_since;
	slowrank_conv_set_counter(c, SLOWRANK_STAT_BUFFERS_REQUESTED, atomic_load(&g.c_requested));
	slowrank_conv_set_counter(c, SLOWRANK_STAT_BUFFERS_REFUSED, atomic_load(&g.c_refused));
	slowrank_conv_set_counter(c, SLOWRANK_STAT_BUFFERS_COMPLETED, atomic_load(&g.c_completed));
	slowrank_conv_set_counter(c, SLOWRANK_STAT_FLUSHES, atomic_load(&g.c_flushes));
	slowrank_conv_set_counter(c, SLOWRANK_STAT_ENABLES, atomic_load(&g.c_enables));
	slowrank_conv_set_counter(c, SLOWRANK_STAT_ATTACHES, atomic_load(&g.c_attaches));
	slowrank_conv_set_counter(c, SLOWRANK_STAT_CUPTI_ERRORS, atomic_load(&g.c_cupti_errors));
	slowrank_conv_set_counter(c, SLOWRANK_STAT_ON_NS, on_ns);
	slowrank_conv_set_counter(c, SLOWRANK_STAT_DISCARDED_DETACHED, atomic_load(&g.c_discarded));
	uint64_t yielded_ns = atomic_load(&g.c_yielded_ns);
	if (g.yielded)
		yielded_ns += mono_ns() - g.yield_since;
	slowrank_conv_set_counter(c, SLOWRANK_STAT_YIELDS, atomic_load(&g.c_yields));
	slowrank_conv_set_counter(c, SLOWRANK_STAT_YIELDED_NS, yielded_ns);
	slowrank_conv_set_counter(c, SLOWRANK_STAT_BUFFERS_ORPHANED,
				  atomic_load(&g.c_orphaned) + atomic_load(&g.c_foreign_buffers));
	slowrank_conv_set_counter(c, SLOWRANK_STAT_LEASE_EXPIRED, atomic_load(&g.c_lease));
	slowrank_conv_set_counter(c, SLOWRANK_STAT_CONTROL_REJECTED, atomic_load(&g.c_rejected));
	slowrank_conv_set_counter(c, SLOWRANK_STAT_REENABLED, atomic_load(&g.c_reenabled));
	slowrank_conv_set_counter(c, SLOWRANK_STAT_SETUPS, atomic_load(&g.c_setups));
	slowrank_conv_set_counter(c, SLOWRANK_STAT_HANDBACKS, atomic_load(&g.c_handbacks));
	slowrank_conv_set_counter(c, SLOWRANK_STAT_FORWARDED, atomic_load(&g.c_forwarded));
	slowrank_conv_set_counter(c, SLOWRANK_STAT_CALLBACKS_TAKEN, atomic_load(&g.c_taken));
	slowrank_conv_set_counter(c, SLOWRANK_STAT_HANDBACK_REJECTED, atomic_load(&g.c_hb_rejected));
	uint64_t k[SLOWRANK_STAT_COUNT] = {0};
	sr_nccl_counters(k);
	for (int i = SR_NCCL_STAT_FIRST; i <= SR_NCCL_STAT_LAST; i++)
		slowrank_conv_set_counter(c, i, k[i]);
}

static void emit_stats(int final)
{
	pthread_mutex_lock(&g.mu);
	if (g.conv) {
		sync_counters();
		slowrank_conv_stats(g.conv, final);
	}
	pthread_mutex_unlock(&g.mu);
}

static void emit_transition(int on, int reason, uint64_t ts)
{
	pthread_mutex_lock(&g.mu);
	if (g.conv)
		slowrank_conv_transition(g.conv, on, reason, (int)g.cfg.mode, ts);
	pthread_mutex_unlock(&g.mu);
}

/* ---------------------------------------------------------------------- */
/* Clock                                                                   */
/* ---------------------------------------------------------------------- */

static void calibrate(void)
{
	uint64_t best_w = UINT64_MAX;
	int64_t best_off = 0;
	for (int i = 0; i < 16; i++) {
		uint64_t t = 0;
		uint64_t a = mono_ns();
		CUptiResult r = g.api.GetTimestamp(&t);
		uint64_t b = mono_ns();
		if (r != CUPTI_SUCCESS || t == 0)
			continue;
		uint64_t w = b - a;
		if (w < best_w) {
			best_w = w;
			best_off = (int64_t)(a + w / 2) - (int64_t)t;
		}
	}
	g.last_calib = mono_ns();
	pthread_mutex_lock(&g.mu);
	if (best_w != UINT64_MAX)
		slowrank_conv_set_clock(g.conv, SLOWRANK_CLOCK_CALIBRATED, best_off,
					best_w > UINT32_MAX ? UINT32_MAX : (uint32_t)best_w);
	else
		slowrank_conv_set_clock(g.conv, SLOWRANK_CLOCK_UNKNOWN, 0, 0);
	pthread_mutex_unlock(&g.mu);
	set_status_flag(SLOWRANK_STATUS_CALIBRATED, best_w != UINT64_MAX);
	DEBUGF("clock calibrated: offset %lld ns, bracket %llu ns", (long long)best_off, (unsigned long long)best_w);
}

/* ---------------------------------------------------------------------- */
/* CUPTI setup and collection                                              */
/* ---------------------------------------------------------------------- */

static void CUPTIAPI noop_callback(void *u, CUpti_CallbackDomain d, CUpti_CallbackId id, const void *p)
{
	(void)u;
	(void)d;
	(void)id;
	(void)p;
}

static void refuse(const char *what, CUptiResult r)
{
	cupti_error(what, r);
	g.refused = 1;
	set_state(SLOWRANK_STATE_REFUSED);
	if (!g.refusal_printed && !g.quiet) {
		g.refusal_printed = 1;
		const char *why = r == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED
					  ? " (another tool owns CUPTI: Kineto/nsys?)"
					  : "";
		logline("backing off, %s: %s (%d)%s", what, result_string(r), (int)r, why);
	}
}

/* Whether another client holds CUPTI's one subscriber slot (Kineto does from
 * its first profiling session on). Called once per attach only: a probe
 * holds the slot for a moment, and a Kineto initialising in that moment
 * would lose GPU tracing for the whole process. */
static int foreign_subscriber(void)
{
	CUpti_SubscriberHandle sub;
	CUptiResult r = g.api.Subscribe(&sub, noop_callback, NULL);
	if (r == CUPTI_SUCCESS) {
		g.api.Unsubscribe(sub);
		return 0;
	}
	if (r != CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED)
		cupti_error("cuptiSubscribe", r);
	return 1;
}

static void disable_kinds(void);
static void flush(uint32_t flags);

/* Registers the buffer callbacks and the clock: at the first use after each
 * attach, after a yield and whenever another client's clock or a
 * cuptiFinalize showed that ours were replaced. The agent has decided that
 * no other client is active (see Yield in slowrank_abi.h). Returns 1 when
 * ready. */
static int setup_cupti(void)
{
	if (!g.loaded || g.refused)
		return 0;
	disable_kinds(); /* a client that left may have left kinds on */
	if (g.on) {
		uint64_t now = mono_ns();
		atomic_fetch_add(&g.c_on_ns, now - g.on_since);
		g.on = 0;
		emit_transition(0, SLOWRANK_REASON_ERROR, now);
	}
	CUptiResult r = g.api.ActivityRegisterCallbacks(buffer_requested, buffer_completed);
	/* A client whose registration entered before this returned may have
	 * lost its callbacks to ours (Handback). */
	g.own_reg_end = mono_ns();
	if (r != CUPTI_SUCCESS) {
		refuse("cuptiActivityRegisterCallbacks", r);
		return 0;
	}
	atomic_fetch_add(&g.c_setups, 1);
	g.ts_callback = 0;
	if (g.api.ActivityRegisterTimestampCallback) {
		r = g.api.ActivityRegisterTimestampCallback(sr_timestamp);
		g.own_ts_end = mono_ns();
		if (r == CUPTI_SUCCESS)
			g.ts_callback = 1;
		else
			cupti_error("cuptiActivityRegisterTimestampCallback", r);
	}
	if (g.ts_callback) {
		pthread_mutex_lock(&g.mu);
		slowrank_conv_set_clock(g.conv, SLOWRANK_CLOCK_MONOTONIC_CALLBACK, 0, 0);
		pthread_mutex_unlock(&g.mu);
		set_status_flag(SLOWRANK_STATUS_TS_CALLBACK, 1);
	} else {
		set_status_flag(SLOWRANK_STATUS_TS_CALLBACK, 0);
		calibrate();
	}
	g.need_setup = 0;
	g.ready = 1;
	/* A client whose first calls raced this registration is given back
	 * its callbacks as soon as the agent's decision lands: look often. */
	fast_poll_until(g.own_reg_end + SR_HANDBACK_POLL_NS);
	g.requested_at_setup = atomic_load(&g.c_requested);
	g.on_ns_at_setup = atomic_load(&g.c_on_ns);
	set_status_flag(SLOWRANK_STATUS_CUPTI_READY, 1);
	DEBUGF("CUPTI ready (clock: %s)", g.ts_callback ? "monotonic callback" : "calibrated");
	return 1;
}

/* Kinds are one global switch: a client that enabled them before this
 * disable lost them (start_yield and give_back enable them again). */
static void disable_kinds(void)
{
	for (size_t i = 0; i < SR_NKINDS; i++) {
		CUptiResult r = g.api.ActivityDisable(sr_kinds[i]);
		if (r != CUPTI_SUCCESS)
			cupti_error("cuptiActivityDisable", r);
	}
	g.last_disable_ns = mono_ns();
}

static void collection_off(int reason, uint64_t now)
{
	if (!g.on)
		return;
	disable_kinds();
	/* Another client starting right now would have lost its kinds: look
	 * for the agent's yield often for a while, to give them back at once. */
	fast_poll_until(g.last_disable_ns + 20ull * 1000000ull);
	/* Once the records in flight have completed, take every buffer back:
	 * a client that starts while collection is off then finds no buffer
	 * of ours in CUPTI to write its first records into (hand_back_due). */
	g.hand_back_at = g.last_disable_ns + SR_HAND_BACK_NS;
	/* And close CUPTI's current buffer now: records that a client starting
	 * meanwhile makes go to a buffer of its own, not into ours. */
	if (reason != SLOWRANK_REASON_ATTACH)
		flush(0);
	g.on = 0;
	atomic_fetch_add(&g.c_on_ns, now - g.on_since);
	emit_transition(0, reason, now);
	DEBUGF("collection off (reason %d)", reason);
}

static int collection_on(int reason, uint64_t now)
{
	if (g.on)
		return 1;
	for (size_t i = 0; i < SR_NKINDS; i++) {
		CUptiResult r = g.api.ActivityEnable(sr_kinds[i]);
		if (r != CUPTI_SUCCESS) {
			disable_kinds();
			refuse("cuptiActivityEnable", r);
			emit_transition(0, SLOWRANK_REASON_ERROR, now);
			return 0;
		}
	}
	g.on = 1;
	g.on_since = now;
	g.hand_back_at = 0;
	atomic_fetch_add(&g.c_enables, 1);
	emit_transition(1, reason, now);
	DEBUGF("collection on (reason %d)", reason);
	return 1;
}

static void flush(uint32_t flags)
{
	CUptiResult r = g.api.ActivityFlushAll(flags);
	atomic_fetch_add(&g.c_flushes, 1);
	if (r == CUPTI_ERROR_INVALID_OPERATION) {
		/* No callbacks registered: someone called cuptiFinalize. */
		g.need_setup = 1;
		g.suspect_until = mono_ns() + SR_SUSPECT_NS;
	}
	if (r != CUPTI_SUCCESS)
		cupti_error("cuptiActivityFlushAll", r);
}

/* ---------------------------------------------------------------------- */
/* Control block                                                           */
/* ---------------------------------------------------------------------- */

static void read_control(uint64_t now)
{
	/* The agent writes through /proc/PID/mem: every field may change under us. */
#define SR_LD(f) __atomic_load_n(&slowrank_cupti_control.f, __ATOMIC_RELAXED)
	uint32_t g1 = __atomic_load_n(&slowrank_cupti_control.generation, __ATOMIC_ACQUIRE);
	if (g1 & 1)
		return; /* the agent is writing */
	struct duty_cfg d;
	d.mode = SR_LD(mode);
	d.on_ms = SR_LD(on_ms);
	d.period_ms = SR_LD(period_ms);
	d.k_steps = SR_LD(k_steps);
	d.n_steps = SR_LD(n_steps);
	d.phase_offset_ns = SR_LD(phase_offset_ns);
	d.escalate_until_ns = SR_LD(escalate_until_ns);
	d.name_resend = SR_LD(name_resend);
	d.agent_flags = SR_LD(agent_flags);
#undef SR_LD
	__atomic_thread_fence(__ATOMIC_ACQUIRE);
	uint32_t g2 = __atomic_load_n(&slowrank_cupti_control.generation, __ATOMIC_ACQUIRE);
	if (g1 != g2)
		return;
	g.cfg = d;
	if (g1 != g.applied_generation) {
		g.applied_generation = g1;
		g.generation_since = now;
		__atomic_store_n(&slowrank_cupti_control.applied_generation, g1, __ATOMIC_RELAXED);
		pthread_mutex_lock(&g.mu);
		if (g.conv)
			slowrank_conv_set_generation(g.conv, g1);
		pthread_mutex_unlock(&g.mu);
		DEBUGF("control generation %u: mode %u on %u ms / %u ms, k %u / n %u", g1, d.mode, d.on_ms, d.period_ms,
		       d.k_steps, d.n_steps);
	}
	if (d.name_resend != g.last_resend) {
		g.last_resend = d.name_resend;
		pthread_mutex_lock(&g.mu);
		if (g.conv)
			slowrank_conv_new_epoch(g.conv);
		pthread_mutex_unlock(&g.mu);
		g.nccl_resend = 1;
	}
}

/* Decides the phase; *wake_ns gets the time until the next boundary. */
static int duty_wants_on(uint64_t now, int *reason, uint64_t *wake_ns)
{
	const struct duty_cfg *d = &g.cfg;
	*wake_ns = SR_POLL_NS;
	*reason = SLOWRANK_REASON_DUTY;
	if (d->escalate_until_ns > now) {
		*reason = SLOWRANK_REASON_ESCALATION;
		if (d->escalate_until_ns - now < *wake_ns)
			*wake_ns = d->escalate_until_ns - now;
		return 1;
	}
	switch (d->mode) {
	case SLOWRANK_DUTY_ALWAYS:
		return 1;
	case SLOWRANK_DUTY_TIME: {
		if (d->period_ms < SLOWRANK_MIN_PERIOD_MS) {
			/* A zero or sub-minimum period is a bad write, not "always". */
			if (g.rejected_generation != g.applied_generation) {
				g.rejected_generation = g.applied_generation;
				atomic_fetch_add(&g.c_rejected, 1);
			}
			return 0;
		}
		if (d->on_ms >= d->period_ms)
			return 1;
		if (d->on_ms == 0)
			return 0;
		uint64_t t = now + (uint64_t)d->phase_offset_ns; /* wraps as intended */
		uint64_t period = (uint64_t)d->period_ms * 1000000ull;
		uint64_t pos = t % period;
		uint64_t on_len = (uint64_t)d->on_ms * 1000000ull;
		uint64_t left = pos < on_len ? on_len - pos : period - pos;
		if (left < *wake_ns)
			*wake_ns = left;
		return pos < on_len;
	}
	case SLOWRANK_DUTY_STEPS: {
		if (d->n_steps == 0)
			return 0;
		uint64_t step = __atomic_load_n(&slowrank_cupti_control.step, __ATOMIC_RELAXED);
		return (step % d->n_steps) < d->k_steps;
	}
	case SLOWRANK_DUTY_OFF:
	default:
		return 0;
	}
}

static void update_status(uint64_t now)
{
	struct slowrank_cupti_control *c = &slowrank_cupti_control;
	uint64_t on_ns = atomic_load(&g.c_on_ns) + (g.on ? now - g.on_since : 0);
	__atomic_store_n(&c->on_ns_total, on_ns, __ATOMIC_RELAXED);
	__atomic_store_n(&c->enables, atomic_load(&g.c_enables), __ATOMIC_RELAXED);
	pthread_mutex_lock(&g.mu);
	if (g.conv) {
		__atomic_store_n(&c->batches, slowrank_conv_counter(g.conv, SLOWRANK_STAT_BATCHES), __ATOMIC_RELAXED);
		__atomic_store_n(&c->records, slowrank_conv_records_emitted(g.conv), __ATOMIC_RELAXED);
		__atomic_store_n(&c->cupti_dropped, slowrank_conv_cupti_dropped(g.conv), __ATOMIC_RELAXED);
		__atomic_store_n(&c->lib_dropped, slowrank_conv_lib_dropped(g.conv), __ATOMIC_RELAXED);
	}
	pthread_mutex_unlock(&g.mu);
	__atomic_store_n(&c->buffers_orphaned, atomic_load(&g.c_orphaned) + atomic_load(&g.c_foreign_buffers),
			 __ATOMIC_RELAXED);
	struct slowrank_cupti_handback *hb = &slowrank_cupti_handback;
	__atomic_store_n(&hb->handbacks, atomic_load(&g.c_handbacks), __ATOMIC_RELAXED);
	__atomic_store_n(&hb->clock_handbacks, atomic_load(&g.c_clock_handbacks), __ATOMIC_RELAXED);
	__atomic_store_n(&hb->forwarded, atomic_load(&g.c_forwarded), __ATOMIC_RELAXED);
	__atomic_store_n(&hb->taken, atomic_load(&g.c_taken), __ATOMIC_RELAXED);
	__atomic_store_n(&hb->rejected, atomic_load(&g.c_hb_rejected), __ATOMIC_RELAXED);
	__atomic_store_n(&c->heartbeat_ns, now, __ATOMIC_RELAXED);
}

/* ---------------------------------------------------------------------- */
/* Handback: the other client's callbacks, given back                      */
/* ---------------------------------------------------------------------- */

/* What the agent published in slowrank_cupti_handback. */
struct hb_view {
	uint32_t flags;
	uint64_t request_fn, complete_fn, pair_ns, timestamp_fn, timestamp_ns, kinds;
};

/* One consistent copy (the agent writes through /proc/PID/mem with a
 * seqlock); 0 while it is writing. */
static int read_handback(struct hb_view *v)
{
	struct slowrank_cupti_handback *hb = &slowrank_cupti_handback;
#define SR_HB(f) __atomic_load_n(&hb->f, __ATOMIC_RELAXED)
	uint32_t s1 = __atomic_load_n(&hb->seq, __ATOMIC_ACQUIRE);
	if (s1 & 1)
		return 0;
	v->flags = SR_HB(flags);
	v->request_fn = SR_HB(request_fn);
	v->complete_fn = SR_HB(complete_fn);
	v->pair_ns = SR_HB(pair_ns);
	v->timestamp_fn = SR_HB(timestamp_fn);
	v->timestamp_ns = SR_HB(timestamp_ns);
	v->kinds = SR_HB(kinds);
#undef SR_HB
	__atomic_thread_fence(__ATOMIC_ACQUIRE);
	return __atomic_load_n(&hb->seq, __ATOMIC_ACQUIRE) == s1;
}

struct code_query {
	uintptr_t addr;
	int found;
};

static int code_cb(struct dl_phdr_info *info, size_t size, void *arg)
{
	(void)size;
	struct code_query *q = arg;
	for (int i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
		if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X))
			continue;
		uintptr_t lo = (uintptr_t)info->dlpi_addr + (uintptr_t)ph->p_vaddr;
		if (q->addr >= lo && q->addr - lo < (uintptr_t)ph->p_memsz) {
			q->found = 1;
			return 1;
		}
	}
	return 0;
}

/* 1 when addr lies in an executable segment of an object loaded in this
 * process: what the agent wrote can be called. */
static int is_code(uint64_t addr)
{
	if (addr == 0 || addr > UINTPTR_MAX)
		return 0;
	struct code_query q = {.addr = (uintptr_t)addr, .found = 0};
	dl_iterate_phdr(code_cb, &q);
	return q.found;
}

static uint64_t fn_addr(const void *fnp, size_t n)
{
	uintptr_t a = 0;
	memcpy(&a, fnp, n < sizeof(a) ? n : sizeof(a));
	return (uint64_t)a;
}

/* Another client's buffers completed to us go to f from now on; the ones
 * held meanwhile go there now. f NULL: held ones are lost (counted). */
static void set_forward(CUpti_BuffersCallbackCompleteFunc f)
{
	struct parked_buffer p[SR_PARK_MAX];
	pthread_mutex_lock(&g.park_mu);
	g.fwd_complete = f;
	int n = g.npark;
	memcpy(p, g.park, (size_t)n * sizeof(p[0]));
	g.npark = 0;
	pthread_mutex_unlock(&g.park_mu);
	if (!f) {
		atomic_fetch_add(&g.c_foreign_buffers, (uint64_t)n);
		return;
	}
	for (int i = 0; i < n; i++) {
		atomic_fetch_add(&g.c_forwarded, 1);
		f(p[i].ctx, p[i].stream, p[i].buffer, p[i].size, p[i].valid);
	}
}

/* While yielded: gives the other client back what this library's last
 * registration (or disable) may have taken from it, as the agent reports
 * it (Handback in slowrank_abi.h): its buffer callbacks, its clock, its
 * kinds, and its buffers that completed to us. Idempotent; called at the
 * yield and at every poll while yielded. */
static void give_back(uint64_t now)
{
	if (!g.yielded)
		return;
	uint64_t since = __atomic_load_n(&slowrank_cupti_control.foreign_since_ns, __ATOMIC_RELAXED);
	struct hb_view v;
	if (since != 0)
		g.hb_since = since;
	if (!read_handback(&v)) {
		fast_poll_until(now + SR_HANDBACK_POLL_NS); /* the agent is writing */
		return;
	}
	if (since == 0)
		return; /* no time to compare with: nothing is given back */
	uint64_t mask = (v.flags & SLOWRANK_HANDBACK_F_KINDS) ? v.kinds : ~0ull;
	if (g.ready && g.last_disable_ns >= since) {
		/* Kinds this library disabled after the other client's first
		 * call (a toggle, or the disable before its registration): the
		 * other client's; on again. */
		int n = 0;
		for (size_t i = 0; i < SR_NKINDS; i++) {
			uint64_t bit = 1ull << (unsigned)sr_kinds[i];
			if (!(mask & bit) || (g.hb_kinds_on & bit))
				continue;
			g.hb_kinds_on |= bit;
			CUptiResult r = g.api.ActivityEnable(sr_kinds[i]);
			if (r != CUPTI_SUCCESS)
				cupti_error("cuptiActivityEnable (other client's kind)", r);
			n++;
		}
		if (n)
			atomic_fetch_add(&g.c_reenabled, 1);
	}
	int handed = 0;
	if ((v.flags & SLOWRANK_HANDBACK_F_PAIR) && v.pair_ns >= since && v.pair_ns != g.hb_pair_seen) {
		g.hb_pair_seen = v.pair_ns;
		CUpti_BuffersCallbackRequestFunc req;
		CUpti_BuffersCallbackCompleteFunc comp;
		uintptr_t a = (uintptr_t)v.request_fn, b = (uintptr_t)v.complete_fn;
		memcpy(&req, &a, sizeof(req));
		memcpy(&comp, &b, sizeof(comp));
		struct slowrank_cupti_handback *hb = &slowrank_cupti_handback;
		if (!is_code(v.request_fn) || !is_code(v.complete_fn) || v.request_fn == hb->own_request ||
		    v.complete_fn == hb->own_complete) {
			atomic_fetch_add(&g.c_hb_rejected, 1);
			DEBUGF("handback: pair %#llx/%#llx refused", (unsigned long long)v.request_fn,
			       (unsigned long long)v.complete_fn);
		} else {
			g.hb_pair_known = 1;
			/* Its buffers that completed to us (ours came after its
			 * registration) go to it; so do those still to come. */
			set_forward(comp);
			if (g.ready && v.pair_ns <= g.own_reg_end) {
				/* Ours may have replaced its pair. Our closed buffers
				 * come back to us first (flush), then its pair is the
				 * registered one again. */
				flush(0);
				CUptiResult r = g.api.ActivityRegisterCallbacks(req, comp);
				if (r == CUPTI_SUCCESS) {
					handed = 1;
					atomic_fetch_add(&g.c_handbacks, 1);
					__atomic_store_n(&hb->applied_pair_ns, v.pair_ns, __ATOMIC_RELAXED);
					orphan_outstanding(); /* ours left in CUPTI now complete to it */
					g.need_setup = 1;
				} else {
					cupti_error("cuptiActivityRegisterCallbacks (other client's)", r);
				}
				DEBUGF("handback: the other client's callbacks registered again (its call %llu, ours until %llu)",
				       (unsigned long long)v.pair_ns, (unsigned long long)g.own_reg_end);
			}
		}
	}
	if ((v.flags & SLOWRANK_HANDBACK_F_CLOCK) && v.timestamp_ns >= since && v.timestamp_ns != g.hb_ts_seen &&
	    g.api.ActivityRegisterTimestampCallback) {
		g.hb_ts_seen = v.timestamp_ns;
		sr_ts_fn ts;
		uintptr_t a = (uintptr_t)v.timestamp_fn;
		memcpy(&ts, &a, sizeof(ts));
		if (!is_code(v.timestamp_fn) || v.timestamp_fn == slowrank_cupti_handback.own_timestamp) {
			atomic_fetch_add(&g.c_hb_rejected, 1);
		} else if (g.own_ts_end != 0 && v.timestamp_ns <= g.own_ts_end) {
			CUptiResult r = g.api.ActivityRegisterTimestampCallback(ts);
			if (r == CUPTI_SUCCESS)
				atomic_fetch_add(&g.c_clock_handbacks, 1);
			else
				cupti_error("cuptiActivityRegisterTimestampCallback (other client's)", r);
			g.need_setup = 1;
		}
	}
	if (handed)
		flush(0); /* a buffer of ours that CUPTI took meanwhile: closed now */
}

/* At the end of a yield: the other client's session began before this
 * library's last registration returned and no pair of that session came
 * from the agent (an agent without Handback): its callbacks may have been
 * ours all along. Counted, for status and /metrics. */
static void count_taken(void)
{
	uint64_t since = g.hb_since;
	if (since != 0 && g.own_reg_end >= since && !g.hb_pair_known) {
		atomic_fetch_add(&g.c_taken, 1);
		if (!g.quiet)
			logline("the other CUPTI client's buffer callbacks may have been replaced by this library's "
				"(it started as the library took CUPTI) and the agent did not say which to give back");
	}
}

/* ---------------------------------------------------------------------- */
/* Control thread                                                          */
/* ---------------------------------------------------------------------- */

static void on_attach(uint64_t now)
{
	g.attached = 1;
	g.refused = 0; /* a new agent: try CUPTI again */
	g.need_setup = 1;
	atomic_fetch_add(&g.c_attaches, 1);
	atomic_store(&g.pool_keep, 1);
	atomic_store(&g.convert_on, 1);
	pthread_mutex_lock(&g.mu);
	if (g.conv)
		slowrank_conv_new_epoch(g.conv);
	pthread_mutex_unlock(&g.mu);
	g.nccl_resend = 1;
	DEBUGF("agent attached (semaphore %u)", (unsigned)slowrank_cupti_semaphore);
	if (!atomic_load(&g.cupti_wanted)) {
		/* Loaded by NCCL only: no CUPTI in this process (yet). */
		g.last_flush = g.last_stats = now;
		emit_stats(0);
		return;
	}
	if (!g.loaded) {
		set_state(SLOWRANK_STATE_UNAVAILABLE);
		/* Tell the agent through the ring buffer too: no device records. */
		emit_transition(0, SLOWRANK_REASON_ERROR, now);
		emit_stats(0);
		return;
	}
	/* Report whether another client holds CUPTI, then wait for the agent's
	 * decision (it watches libcupti for other clients). */
	set_status_flag(SLOWRANK_STATUS_FOREIGN_SUBSCRIBER, foreign_subscriber());
	g.seen_cupti_gen = __atomic_load_n(&slowrank_cupti_control.cupti_gen, __ATOMIC_ACQUIRE);
	g.waiting = 1;
	g.wait_since = now;
	g.wait_poll = 1000000ull;
	set_status_flag(SLOWRANK_STATUS_WAITING, 1);
	set_state(SLOWRANK_STATE_OFF_PHASE);
	g.last_flush = g.last_stats = now;
	emit_stats(0);
}

static void end_yield(uint64_t now)
{
	if (!g.yielded)
		return;
	g.yielded = 0;
	atomic_fetch_add(&g.c_yielded_ns, now - g.yield_since);
	__atomic_store_n(&slowrank_cupti_control.yielded_ns_total, atomic_load(&g.c_yielded_ns), __ATOMIC_RELAXED);
}

static void on_detach(uint64_t now)
{
	g.attached = 0;
	g.waiting = 0;
	set_status_flag(SLOWRANK_STATUS_WAITING, 0);
	atomic_store(&g.convert_on, 0);
	atomic_store(&g.pool_keep, 0);
	if (g.yielded) {
		/* CUPTI is the other client's: touch nothing. */
		count_taken();
		end_yield(now);
		g.on = 0;
	} else if (g.ready) {
		collection_off(SLOWRANK_REASON_ATTACH, now);
		flush(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED); /* hand every buffer back */
	}
	set_forward(NULL); /* nobody says whose held buffers are now */
	release_idle_buffers();
	if (g.loaded)
		set_state(SLOWRANK_STATE_IDLE);
	DEBUGF("agent detached");
}

/* Another client started (the agent saw its CUPTI calls): no more CUPTI
 * calls from here. Kinds left on are the other client's now; kinds this
 * library disabled after that client's first call are enabled again. */
static void start_yield(uint64_t now)
{
	uint64_t since = __atomic_load_n(&slowrank_cupti_control.foreign_since_ns, __ATOMIC_RELAXED);
	g.yielded = 1;
	g.yield_since = now;
	atomic_fetch_add(&g.c_yields, 1);
	__atomic_store_n(&slowrank_cupti_control.yields, (uint32_t)atomic_load(&g.c_yields), __ATOMIC_RELAXED);
	g.hb_pair_seen = g.hb_ts_seen = 0;
	g.hb_pair_known = 0;
	g.hb_since = since;
	g.hb_kinds_on = 0;
	if (g.on) {
		/* Our kinds are on: the other client's now. */
		atomic_fetch_add(&g.c_on_ns, now - g.on_since);
		g.on = 0;
		for (size_t i = 0; i < SR_NKINDS; i++)
			g.hb_kinds_on |= 1ull << (unsigned)sr_kinds[i];
	}
	/* CUPTI's current buffer may be ours, with the other client's first
	 * records in it: have CUPTI close it (it completes to the other
	 * client's callbacks now) so that the rest go to a buffer of its own. */
	if (g.ready)
		flush(0);
	/* Its kinds we disabled, its callbacks and clock if ours replaced
	 * them (Handback); the agent may tell those a little later. */
	give_back(now);
	fast_poll_until(now + SR_HANDBACK_POLL_NS);
	g.hand_back_at = 0;
	emit_transition(0, SLOWRANK_REASON_YIELD, now);
	set_state(SLOWRANK_STATE_YIELDED);
	if (!g.quiet)
		logline("another CUPTI client started (Kineto, nsys?): device collection yields to it");
	DEBUGF("yield (foreign since %llu, last disable %llu)", (unsigned long long)since,
	       (unsigned long long)g.last_disable_ns);
}

/* The other client is gone: register again, orphan what it may have taken. */
static void stop_yield(uint64_t now)
{
	count_taken();
	set_forward(NULL);
	end_yield(now);
	g.suspect_until = 0;
	atomic_store(&g.foreign_clock, 0);
	orphan_outstanding();
	g.need_setup = 1;
	set_state(SLOWRANK_STATE_OFF_PHASE);
	DEBUGF("the other CUPTI client is gone: resuming");
}

/* The next poll while waiting for the agent's first decision (SR_WAIT_*). */
static uint64_t wait_poll_ns(uint64_t now)
{
	if (now - g.wait_since < SR_WAIT_FAST_NS)
		return 1000000ull;
	g.wait_poll = g.wait_poll >= SR_WAIT_POLL_MAX_NS / 2 ? SR_WAIT_POLL_MAX_NS : 2 * g.wait_poll;
	return g.wait_poll;
}

/* The agent's decision about other CUPTI clients; 1 while CUPTI must not
 * be touched. While waiting for the first one, *wake is the next poll. */
static int yield_gate(uint64_t now, uint64_t *wake)
{
	struct slowrank_cupti_control *c = &slowrank_cupti_control;
	uint32_t gen = __atomic_load_n(&c->cupti_gen, __ATOMIC_ACQUIRE);
	if (g.waiting) {
		if (gen == g.seen_cupti_gen) {
			*wake = wait_poll_ns(now);
			return 1;
		}
		g.waiting = 0;
		set_status_flag(SLOWRANK_STATUS_WAITING, 0);
	}
	int y = __atomic_load_n(&c->yield, __ATOMIC_ACQUIRE) != 0;
	if (y && !g.yielded) {
		start_yield(now);
	} else if (!y && g.yielded) {
		stop_yield(now);
	} else if (g.yielded) {
		if (gen != g.seen_cupti_gen)
			fast_poll_until(now + SR_HANDBACK_POLL_NS); /* the agent wrote: more may follow */
		give_back(now);
	}
	g.seen_cupti_gen = gen;
	return g.yielded;
}

/* 1 when the agent's configuration outlived its lease (a hung agent). */
static int lease_expired(uint64_t now)
{
	if (g.applied_generation == 0 || g.force_attach)
		return 0; /* never written by an agent (validation modes) */
	int expired = now - g.generation_since > (uint64_t)SLOWRANK_LEASE_MS * 1000000ull;
	if (expired && !g.lease_expired)
		atomic_fetch_add(&g.c_lease, 1);
	g.lease_expired = expired;
	set_status_flag(SLOWRANK_STATUS_LEASE_EXPIRED, expired);
	return expired;
}

/* CUPTI never asked for a buffer in SR_NO_BUFFER_NS of collection since
 * the callbacks were registered. */
static int no_buffers_since_setup(uint64_t now)
{
	if (atomic_load(&g.c_requested) != g.requested_at_setup)
		return 0;
	uint64_t on = atomic_load(&g.c_on_ns) + (now - g.on_since) - g.on_ns_at_setup;
	return on >= SR_NO_BUFFER_NS;
}

/* Whether the buffers still held after collection went off are to be
 * taken back now. A forced flush returns the records of work still queued
 * on the GPU without timestamps, so it waits until normal flushes (every
 * SR_FLUSH_NS while buffers are outstanding) have returned every buffer,
 * or until SR_DRAIN_MAX_NS after the disable for a buffer that never
 * completes (an empty current buffer, a hung kernel). */
static int hand_back_due(uint64_t now)
{
	if (g.hand_back_at == 0 || now < g.hand_back_at)
		return 0;
	return outstanding_buffers() == 0 || now - g.last_disable_ns >= SR_DRAIN_MAX_NS;
}

/* One poll while attached; *wake gets the time to the next boundary. */
static void attached_tick(uint64_t now, uint64_t *wake)
{
	if (yield_gate(now, wake) || !g.loaded || g.refused)
		return;
	if (atomic_exchange(&g.foreign_clock, 0)) {
		/* Another client replaced our clock: it is starting. Touch
		 * nothing for a while: the agent, which sees its calls, will
		 * say yield; if it does not, take CUPTI back then. */
		g.need_setup = 1;
		g.suspect_until = now + SR_SUSPECT_NS;
	}
	if (now < g.suspect_until) {
		if (g.suspect_until - now < *wake)
			*wake = g.suspect_until - now;
		return;
	}
	if (g.need_setup && !setup_cupti())
		return;
	int reason;
	int want = duty_wants_on(now, &reason, wake);
	if (lease_expired(now)) {
		want = 0;
		reason = SLOWRANK_REASON_LEASE;
	}
	if (want && !g.on)
		collection_on(reason, now);
	else if (!want && g.on)
		collection_off(reason, now);
	if (g.on && no_buffers_since_setup(now)) {
		collection_off(SLOWRANK_REASON_ERROR, now);
		g.refused = 1;
		atomic_fetch_add(&g.c_cupti_errors, 1);
		set_state(SLOWRANK_STATE_REFUSED);
		if (!g.quiet)
			logline("CUPTI asked this library for no buffer in %llu s of collection: its records go to another "
				"client's callbacks; device collection off until the agent attaches again",
				(unsigned long long)(SR_NO_BUFFER_NS / 1000000000ull));
	}
	if (!g.refused)
		set_state(g.on ? SLOWRANK_STATE_ON : SLOWRANK_STATE_OFF_PHASE);
	if (!g.on && hand_back_due(now)) {
		if (outstanding_buffers() > 0)
			flush(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
		g.hand_back_at = 0;
		g.last_flush = now;
	} else if ((g.on || outstanding_buffers() > 0) && now - g.last_flush >= SR_FLUSH_NS) {
		flush(0);
		g.last_flush = now;
	}
	if (g.hand_back_at != 0 && g.hand_back_at - now < *wake)
		*wake = g.hand_back_at > now ? g.hand_back_at - now : 1000000ull;
	if (now - g.last_stats >= SR_STATS_NS) {
		emit_stats(0);
		g.last_stats = now;
	}
	if (!g.ts_callback && now - g.last_calib >= SR_CALIB_NS)
		calibrate();
	/* While collecting, CUPTI's current buffer is ours: a client that
	 * starts now writes its first records into it until this library
	 * yields. Look for the agent's decision often. */
	if (g.on && SR_ON_POLL_NS < *wake)
		*wake = SR_ON_POLL_NS;
}

/* At exit CUPTI's own exit handlers may already have run: no CUPTI call,
 * only the final counters (records of the last <= 100 ms are not flushed). */
static void on_exit_request(void)
{
	if (g.attached) {
		pthread_mutex_lock(&g.mu);
		if (g.conv)
			sr_nccl_drain(g.conv, 1, 0, mono_ns());
		pthread_mutex_unlock(&g.mu);
		emit_stats(1);
	}
}

/* The NCCL plugin's share of a poll: its mask follows the attach and the
 * duty cycle (kernel-channel events only in on-phases, like CUPTI's kinds,
 * and not past the agent's lease), and its ring is drained into the open
 * batch, which is emitted at most every SR_FLUSH_NS (one trap per batch:
 * CUPTI's buffers and transitions emit it sooner). */
static void nccl_tick(uint64_t now, uint64_t *wake)
{
	if (!sr_nccl_active())
		return;
	int kernel_on = 0;
	if (g.attached) {
		int reason;
		uint64_t w = SR_POLL_NS;
		kernel_on = duty_wants_on(now, &reason, &w) && !lease_expired(now) &&
			    !(g.cfg.agent_flags & SLOWRANK_AGENT_F_NCCL_NO_KERNELCH);
		if (w < *wake)
			*wake = w;
	}
	/* NCCL calls the plugin per operation only for an agent that takes its
	 * records (validation modes: always): records nobody reads would be
	 * cost without use. */
	int plugin = g.attached && ((g.cfg.agent_flags & SLOWRANK_AGENT_F_NCCL_PLUGIN) || g.force_attach) &&
		     !lease_expired(now);
	sr_nccl_set_mask(plugin, kernel_on);
	if (now - g.last_rt_calib >= SR_CALIB_NS) {
		sr_nccl_calibrate();
		g.last_rt_calib = now;
	}
	pthread_mutex_lock(&g.mu);
	if (g.conv) {
		sr_nccl_drain(g.conv, g.attached, g.nccl_resend, now);
		g.nccl_resend = 0;
		if (slowrank_conv_pending(g.conv) > 0 && now - g.last_nccl_flush >= SR_FLUSH_NS) {
			slowrank_conv_flush(g.conv);
			g.last_nccl_flush = now;
		}
	}
	pthread_mutex_unlock(&g.mu);
	if (g.attached && now - g.last_stats >= SR_STATS_NS && !g.loaded) {
		/* attached_tick sends them when CUPTI runs */
		emit_stats(0);
		g.last_stats = now;
	}
	if (SR_FLUSH_NS < *wake)
		*wake = SR_FLUSH_NS;
}

/* Loads libcupti, once the CUDA driver loaded the library (InitializeInjection). */
static void start_cupti(void)
{
	g.cupti_tried = 1;
	g.loaded = load_cupti();
	if (g.loaded) {
		set_status_flag(SLOWRANK_STATUS_CUPTI_LOADED, 1);
		__atomic_store_n(&slowrank_cupti_control.cupti_version, g.api.version, __ATOMIC_RELAXED);
		set_state(SLOWRANK_STATE_IDLE);
		if (!g.quiet)
			logline("ready, libcupti %s (api %u); collection off until an agent attaches%s", g.api.path,
				g.api.version, g.force_attach ? " (forced attach)" : "");
	} else {
		set_state(SLOWRANK_STATE_UNAVAILABLE);
		atomic_fetch_add(&g.c_cupti_errors, 1);
		if (!g.quiet)
			logline("inactive, libcupti not found (set SLOWRANK_CUPTI_LIB or CUDA_HOME)");
	}
	if (g.attached) {
		/* NCCL started us and an agent was already attached: go through
		 * CUPTI's attach protocol now (wait for the yield decision). */
		g.attached = 0;
		on_attach(mono_ns());
	}
}

static void *control_main(void *arg)
{
	(void)arg;
	pthread_setname_np(pthread_self(), "slowrank-cupti");
	pid_t tid = (pid_t)syscall(SYS_gettid);
	setpriority(PRIO_PROCESS, (id_t)tid, 10);
	__atomic_store_n(&slowrank_cupti_control.ctl_tid, (uint32_t)tid, __ATOMIC_RELEASE);
	set_status_flag(SLOWRANK_STATUS_THREAD_ALIVE, 1);

	pthread_mutex_lock(&g.ctl_mu);
	for (;;) {
		if (g.exit_requested)
			break;
		pthread_mutex_unlock(&g.ctl_mu);

		if (!g.cupti_tried && atomic_load(&g.cupti_wanted))
			start_cupti();
		uint64_t now = mono_ns();
		uint64_t wake = SR_POLL_NS;
		read_control(now);
		int sem = __atomic_load_n(&slowrank_cupti_semaphore, __ATOMIC_RELAXED) != 0 || g.force_attach;
		if (sem && !g.attached)
			on_attach(now);
		else if (!sem && g.attached)
			on_detach(now);
		if (g.attached && g.cupti_tried)
			attached_tick(now, &wake);
		nccl_tick(now, &wake);
		update_status(now);
		if (now < g.fast_until && wake > 1000000ull)
			wake = 1000000ull;

		if (wake < 1000000ull)
			wake = 1000000ull;
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		uint64_t deadline = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec + wake;
		ts.tv_sec = (time_t)(deadline / 1000000000ull);
		ts.tv_nsec = (long)(deadline % 1000000000ull);
		pthread_mutex_lock(&g.ctl_mu);
		if (!g.exit_requested)
			pthread_cond_timedwait(&g.ctl_cond, &g.ctl_mu, &ts);
	}
	pthread_mutex_unlock(&g.ctl_mu);

	on_exit_request();
	update_status(mono_ns());
	set_status_flag(SLOWRANK_STATUS_THREAD_ALIVE, 0);

	pthread_mutex_lock(&g.ctl_mu);
	g.exit_done = 1;
	pthread_cond_broadcast(&g.ctl_cond);
	pthread_mutex_unlock(&g.ctl_mu);
	return NULL;
}

/* ---------------------------------------------------------------------- */
/* Process lifecycle                                                       */
/* ---------------------------------------------------------------------- */

static void at_exit(void)
{
	if (!atomic_load(&g.initialized) || atomic_load(&g.forked_child) || getpid() != g.pid)
		return;
	static _Atomic int once;
	if (atomic_exchange(&once, 1))
		return;
	if (g.thread_started) {
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		uint64_t deadline = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec + SR_EXIT_WAIT_NS;
		ts.tv_sec = (time_t)(deadline / 1000000000ull);
		ts.tv_nsec = (long)(deadline % 1000000000ull);
		pthread_mutex_lock(&g.ctl_mu);
		g.exit_requested = 1;
		pthread_cond_broadcast(&g.ctl_cond);
		while (!g.exit_done)
			if (pthread_cond_timedwait(&g.ctl_cond, &g.ctl_mu, &ts) == ETIMEDOUT)
				break;
		pthread_mutex_unlock(&g.ctl_mu);
	}
	if (g.debug) {
		struct slowrank_cupti_control *c = &slowrank_cupti_control;
		logline("exit: state %u attaches %llu enables %llu on_ms %llu batches %llu records %llu "
			"cupti_dropped %llu lib_dropped %llu buffers %llu/%llu refused %llu errors %llu",
			__atomic_load_n(&c->state, __ATOMIC_RELAXED), (unsigned long long)atomic_load(&g.c_attaches),
			(unsigned long long)atomic_load(&g.c_enables),
			(unsigned long long)(__atomic_load_n(&c->on_ns_total, __ATOMIC_RELAXED) / 1000000ull),
			(unsigned long long)__atomic_load_n(&c->batches, __ATOMIC_RELAXED),
			(unsigned long long)__atomic_load_n(&c->records, __ATOMIC_RELAXED),
			(unsigned long long)__atomic_load_n(&c->cupti_dropped, __ATOMIC_RELAXED),
			(unsigned long long)__atomic_load_n(&c->lib_dropped, __ATOMIC_RELAXED),
			(unsigned long long)atomic_load(&g.c_completed),
			(unsigned long long)atomic_load(&g.c_requested), (unsigned long long)atomic_load(&g.c_refused),
			(unsigned long long)atomic_load(&g.c_cupti_errors));
	}
}

__attribute__((destructor)) static void sr_fini(void)
{
	at_exit();
}

static void at_fork_child(void)
{
	/* No control thread in the child; CUDA is unusable there anyway. */
	atomic_store(&g.forked_child, 1);
	atomic_store(&g.convert_on, 0);
}

static int env_flag(const char *name)
{
	const char *v = getenv(name);
	return v && *v && strcmp(v, "0") != 0 && strcmp(v, "false") != 0;
}

static long env_long(const char *name, long def, long lo, long hi)
{
	const char *v = getenv(name);
	if (!v || !*v)
		return def;
	char *end = NULL;
	long n = strtol(v, &end, 10);
	if (!end || *end || n < lo || n > hi)
		return def;
	return n;
}

static void initial_mode(void)
{
	const char *m = getenv("SLOWRANK_CUPTI_MODE");
	if (!m || !*m)
		return;
	struct slowrank_cupti_control *c = &slowrank_cupti_control;
	unsigned on = 0, period = 0;
	if (strcmp(m, "always") == 0)
		c->mode = SLOWRANK_DUTY_ALWAYS;
	else if (strcmp(m, "off") == 0)
		c->mode = SLOWRANK_DUTY_OFF;
	else if (sscanf(m, "time:%u:%u", &on, &period) == 2) {
		c->mode = SLOWRANK_DUTY_TIME;
		c->on_ms = on;
		c->period_ms = period;
	}
}

/* Once per process, from whichever comes first: the CUDA driver's
 * InitializeInjection or NCCL's first init of the plugin. Returns 1 when the
 * control thread runs (or is being started by the other caller). */
static int runtime_init(void);
static _Atomic int runtime_ok = -1; /* -1 starting, 0 failed or disabled, 1 running */

static int runtime_start(void)
{
	int expected = 0;
	if (!atomic_compare_exchange_strong(&g.initialized, &expected, 1)) {
		/* The other caller is starting it: wait (bounded) for its verdict. */
		for (int i = 0; i < 2000 && atomic_load(&runtime_ok) < 0; i++)
			usleep(1000);
		return atomic_load(&runtime_ok) == 1;
	}
	int ok = runtime_init();
	atomic_store(&runtime_ok, ok);
	return ok;
}

SR_EXPORT int InitializeInjection(void)
{
	atomic_store(&g.cupti_wanted, 1);
	runtime_start();
	if (g.thread_started) {
		pthread_mutex_lock(&g.ctl_mu);
		pthread_cond_broadcast(&g.ctl_cond); /* load CUPTI now */
		pthread_mutex_unlock(&g.ctl_mu);
	}
	return 1;
}

int sr_runtime_start_for_plugin(void)
{
	return runtime_start();
}

/* SLOWRANK_CUPTI_DUMP (validation only) in a process that may run as root:
 * another user who plants a symbolic link where it points (a shared /tmp)
 * must not make it append to a file of its choice. No symbolic link is
 * followed anywhere in the path (openat2 RESOLVE_NO_SYMLINKS; where the
 * kernel or a seccomp filter lacks it, O_NOFOLLOW on the last component),
 * and the file must be a regular file of this user with one link (no hard
 * link to another file, no FIFO to block on). Otherwise no dump, said on
 * stderr whatever SLOWRANK_CUPTI_QUIET says: it was asked for. */
static int open_dump(const char *path)
{
	int flags = O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK;
	int fd = -1;
	errno = ENOSYS;
#ifdef SYS_openat2
	struct open_how how = {.flags = (uint64_t)flags, .mode = 0644, .resolve = RESOLVE_NO_SYMLINKS};
	fd = (int)syscall(SYS_openat2, AT_FDCWD, path, &how, sizeof(how));
#endif
	if (fd < 0 && (errno == ENOSYS || errno == EPERM))
		fd = open(path, flags, 0644);
	if (fd < 0) {
		logline("SLOWRANK_CUPTI_DUMP=%s refused: %s%s", path, strerror(errno),
			errno == ELOOP ? " (no symbolic link may be in the path)" : "");
		return -1;
	}
	struct stat st;
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_nlink != 1 || st.st_uid != geteuid()) {
		close(fd);
		logline("SLOWRANK_CUPTI_DUMP=%s refused: not a regular file of this user with one link", path);
		return -1;
	}
	return fd;
}

static int runtime_init(void)
{
	g.pid = getpid();
	g.mono0 = mono_ns();
	g.tsc0 = tsc_now();
	g.debug = env_flag("SLOWRANK_CUPTI_DEBUG");
	g.quiet = env_flag("SLOWRANK_CUPTI_QUIET") && !g.debug;
	if (env_flag("SLOWRANK_CUPTI_DISABLE")) {
		g.disabled = 1;
		set_state(SLOWRANK_STATE_DISABLED);
		if (!g.quiet)
			logline("disabled by SLOWRANK_CUPTI_DISABLE");
		return 0;
	}
	g.force_attach = env_flag("SLOWRANK_CUPTI_FORCE_ATTACH");
	set_status_flag(SLOWRANK_STATUS_FORCED_ATTACH, g.force_attach);
	g.npool = (int)env_long("SLOWRANK_CUPTI_BUFFERS", 8, 2, SR_POOL_MAX);
	g.bufsize = (size_t)env_long("SLOWRANK_CUPTI_BUFFER_KB", 1024, 64, 8192) * 1024u;
	initial_mode();
	const char *dump = getenv("SLOWRANK_CUPTI_DUMP");
	if (dump && *dump)
		g.dump_fd = open_dump(dump);

	/* Where the agent finds the handback block, and our callbacks in it. */
	slowrank_cupti_handback.own_request = fn_addr(&(CUpti_BuffersCallbackRequestFunc){buffer_requested},
						      sizeof(CUpti_BuffersCallbackRequestFunc));
	slowrank_cupti_handback.own_complete = fn_addr(&(CUpti_BuffersCallbackCompleteFunc){buffer_completed},
						       sizeof(CUpti_BuffersCallbackCompleteFunc));
	slowrank_cupti_handback.own_timestamp = fn_addr(&(sr_ts_fn){sr_timestamp}, sizeof(sr_ts_fn));
	__atomic_store_n(&slowrank_cupti_control.handback_addr, (uint64_t)(uintptr_t)&slowrank_cupti_handback,
			 __ATOMIC_RELEASE);

	struct slowrank_conv_config cfg = {.pid = (uint32_t)g.pid, .emit = rt_emit, .emit_user = NULL};
	g.conv = slowrank_conv_new(&cfg);
	if (!g.conv) {
		if (!g.quiet)
			logline("inactive, out of memory");
		set_state(SLOWRANK_STATE_UNAVAILABLE);
		return 0;
	}

	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&g.ctl_cond, &ca);
	pthread_condattr_destroy(&ca);

	pthread_atfork(NULL, NULL, at_fork_child);
	atexit(at_exit);

	/* The thread must not take the application's signals. */
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	pthread_attr_t attr;
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	pthread_attr_setstacksize(&attr, 256 * 1024);
	int rc = pthread_create(&g.thread, &attr, control_main, NULL);
	pthread_attr_destroy(&attr);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (rc != 0) {
		if (!g.quiet)
			logline("inactive, cannot start the control thread: %s", strerror(rc));
		set_state(SLOWRANK_STATE_UNAVAILABLE);
		return 0;
	}
	g.thread_started = 1;
	return 1;
}
