//go:build ignore

/*
 * slowrank_nccl.c - the NCCL profiler plugin inside libslowrank_cupti.so.
 *
 * NCCL >= 2.27 dlopens one profiler plugin per process (NCCL_PROFILER_PLUGIN)
 * and calls it through function pointers: no uprobe trap per collective.
 * Pods point NCCL_PROFILER_PLUGIN at the same file as CUDA_INJECTION64_PATH;
 * glibc maps it once, so NCCL and the CUDA driver share one instance: one
 * control thread, one converter, one emit (one trap per batch for both kinds
 * of records). Loaded by NCCL alone it runs without CUPTI.
 *
 * Exports ncclProfiler_v6 (NCCL 2.29, 2.30: copy-engine collectives as
 * CeColl events), ncclProfiler_v5 (NCCL 2.28, the API torch 2.11 ships) and
 * ncclProfiler_v4 (NCCL 2.27); NCCL binds the newest it knows. ABI:
 * nccl_profiler.h, checked against the release tags' own headers.
 *
 * Hot path (NCCL's user thread, its CUDA host-callback thread and its proxy
 * thread, concurrently): no allocation, no lock, no syscall but the vDSO
 * clock. Handles are tagged integers, never pointers: an event's state lives
 * in fixed rings of slots reused in allocation order, and a handle carries
 * its slot's generation, so a stale, foreign or forged handle is detected by
 * comparison and never dereferenced (counted, SLOWRANK_STAT_NCCL_BAD_HANDLES).
 * Finished records go into one bounded lock-free multi-producer ring
 * (Vyukov's queue); when it is full the record is dropped and counted, NCCL
 * never waits. The control thread drains the ring into batches.
 *
 * Activation: NCCL reads one process-wide mask through the pointer it passes
 * to init, per operation. The plugin keeps that pointer and the control
 * thread stores 0 there while no agent is attached (NCCL then makes no call
 * at all), Coll/P2p (+ CollApi/P2pApi from v5, CeColl on v6) while one is, plus KernelCh
 * (GPU timers per channel, which cost device and proxy time) only in the
 * duty cycle's on-phases. Events started before a change still stop cleanly.
 *
 * Environment: SLOWRANK_NCCL_DISABLE=1 (or SLOWRANK_CUPTI_DISABLE=1) makes
 * init fail, so NCCL runs without the plugin.
 */
#define _GNU_SOURCE
#include "nccl_profiler.h"
#include "slowrank_convert.h"
#include "slowrank_nccl.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define SR_EXPORT __attribute__((visibility("default")))

/* Relaxed atomic access to plain fields that another thread may read while
 * a slot is reused (free on x86-64 and aarch64; keeps TSan exact). */
#define LD(p) __atomic_load_n(&(p), __ATOMIC_RELAXED)
#define ST(p, v) __atomic_store_n(&(p), (v), __ATOMIC_RELAXED)

/* ---------------------------------------------------------------------- */
/* Exported status                                                         */
/* ---------------------------------------------------------------------- */

SR_EXPORT __attribute__((used, aligned(64))) struct slowrank_nccl_status slowrank_nccl_status = {
	.magic = SLOWRANK_NCCL_STATUS_MAGIC,
	.version = SLOWRANK_NCCL_STATUS_VERSION,
	.size = sizeof(struct slowrank_nccl_status),
};

/* ---------------------------------------------------------------------- */
/* Handles                                                                 */
/* ---------------------------------------------------------------------- */

/* [63:56] tag, [55:52] kind, [51:44] channel (H_KCH) or API block (H_API),
 * [43:12] generation, [11:0] slot. */
#define H_TAG 0xA5ull
#define H_IGNORED 1 /* Group, GroupApi, KernelLaunch...: accepted, nothing recorded */
#define H_API 2     /* CollApi / P2pApi */
#define H_OP 3      /* Coll / P2p / CeColl */
#define H_KCH 4     /* KernelCh of an H_OP slot */

#define N_API 1024u       /* API events per block in flight before reuse (a group of > 1024 calls loses the join) */
#define N_API_OWN 16u     /* threads with a block of their own; others share block 0 */
#define N_OP 4096u        /* operations whose kernel channels may still report */
#define N_COMM 256u       /* live communicators */
#define N_CELLS 8192u     /* ring: at 50 ms drains, 160 k records/s */
#define SR_NCCL_LAG_N 32u /* kernel records whose host sightings set the clock offset */
/* How far the sightings' offset may lie from the realtime one and be used:
 * the driver's drift from CLOCK_REALTIME (0.43 ms seen), not another epoch. */
#define SR_NCCL_SEEN_MAX_NS 10000000ll

static inline void *h_make(unsigned kind, unsigned ch, uint32_t gen, uint32_t idx)
{
	uint64_t v = (H_TAG << 56) | ((uint64_t)(kind & 0xf) << 52) | ((uint64_t)(ch & 0xff) << 44) |
		     ((uint64_t)gen << 12) | (idx & 0xfff);
	return (void *)(uintptr_t)v;
}

static inline int h_parse(const void *h, unsigned *kind, unsigned *ch, uint32_t *gen, uint32_t *idx)
{
	uint64_t v = (uint64_t)(uintptr_t)h;
	if ((v >> 56) != H_TAG)
		return 0;
	*kind = (unsigned)(v >> 52) & 0xf;
	*ch = (unsigned)(v >> 44) & 0xff;
	*gen = (uint32_t)(v >> 12);
	*idx = (uint32_t)v & 0xfff;
	return 1;
}

/* ---------------------------------------------------------------------- */
/* State                                                                   */
/* ---------------------------------------------------------------------- */

/* A CollApi/P2pApi event: the user's call. */
struct api_slot {
	uint32_t gen; /* 0 while being (re)filled */
	uint16_t flags;
	uint64_t start_ns, end_ns;
};

/* A Coll/P2p/CeColl event, and the aggregate of its kernel channels. */
struct op_slot {
	uint32_t gen; /* 0 while being (re)filled */
	uint32_t comm_id;
	uint64_t comm_hash;
	int32_t rank, nranks;
	uint8_t func, dtype, algo, proto, nchannels, version;
	uint16_t flags;
	int32_t root;
	uint32_t tid;
	uint64_t count, seq;
	void *api; /* parent CollApi/P2pApi handle (v5) while its end is still to be read */
	uint64_t api_start_ns, api_end_ns;
	uint16_t api_flags; /* 0: no API times */
	uint64_t launch_start_ns;
	/* kernel channels, updated by the proxy thread: gen << 32 | stopped << 16 | started */
	_Atomic uint64_t kstate;
	_Atomic uint32_t kemitted;            /* the NCCL_KERNEL record was queued */
	_Atomic uint64_t kstart, kend, kseen; /* raw globaltimer min / max, host mono max */
};

#define COMM_FREE 0
#define COMM_BUSY 1
#define COMM_LIVE 2

struct comm_slot {
	_Atomic int state;
	uint8_t version;
	int8_t mask; /* its NCCL copy's entry of P.masks (-1: none); under mask_mu */
	uint64_t hash;
	int32_t rank, nranks, nnodes;
	uint64_t init_ns;
};

/* NCCL's process-wide ncclProfilerEventMask of one copy of libnccl (a
 * process may load two: torch's and another's). Each copy passes its own
 * to init; the control thread writes every one that a live communicator
 * registered, and none after that copy's last communicator finalized: NCCL
 * may unload itself then, and the mask with it. */
#define N_MASKS 8
struct mask_ref {
	int *ptr;
	uint32_t refs; /* live communicators of this copy (0: free entry) */
	int written;   /* last value stored */
};

/* What a ring cell carries; records are final but for kernel timers
 * (raw globaltimer, converted when drained). */
struct cell {
	_Atomic uint64_t seq;
	uint16_t kind;
	union {
		struct slowrank_nccl_comm_record comm;
		struct slowrank_nccl_coll_record coll;
		struct slowrank_nccl_kernel_record kernel;
	} r;
};

/* API slots come in blocks: a thread that makes NCCL calls owns one while
 * it lives, so its CollApi slots are reused only by its own later calls. A
 * Coll event reads its parent's slot at group end, on the thread that made
 * the calls: with one shared ring, other threads' calls recycled the slot
 * while that thread was preempted in between (a loaded 2-core host lost the
 * join of 1 collective in ~1,600). Block 0 is shared by threads beyond
 * N_API_OWN. */
struct api_block {
	_Atomic uint64_t next; /* continues across owners: generations never repeat */
	struct api_slot slot[N_API];
};

static struct {
	struct api_block api[1 + N_API_OWN];
	_Atomic uint32_t api_owned; /* bit b-1: block b has an owner */
	pthread_key_t api_key;      /* releases a thread's block when it exits */
	int api_key_ok;
	struct op_slot op[N_OP];
	struct comm_slot comm[N_COMM];
	_Atomic uint64_t op_next;

	/* ring */
	struct cell cells[N_CELLS];
	_Atomic uint64_t enq;
	uint64_t deq; /* control thread only */

	/* mask */
	pthread_mutex_t mask_mu;        /* init, finalize and the control thread: never the hot path */
	struct mask_ref masks[N_MASKS]; /* one per NCCL copy with a live communicator */
	_Atomic int desired;            /* what init stores (the control thread keeps it current) */
	_Atomic uint32_t version;       /* API version NCCL bound (4, 5, 6) */
	_Atomic int live;

	/* clock: CLOCK_MONOTONIC - CLOCK_REALTIME */
	_Atomic int64_t rt_offset;
	_Atomic int rt_known;
	/* host_seen_ns - raw GPU end of the latest kernel records: the
	 * GPU-to-monotonic offset plus the proxy's latency (control thread
	 * only, convert_kernel) */
	int64_t seen_lag[SR_NCCL_LAG_N];
	uint32_t nlag, ilag;

	/* counters */
	_Atomic uint64_t c_events, c_colls, c_kernels, c_full, c_discarded, c_bad, c_incomplete, c_comms,
		c_comm_overflow, c_clock_suspect, c_unknown, c_api_lost, c_clock_clamped;
} P = {
	.mask_mu = PTHREAD_MUTEX_INITIALIZER,
};

static __thread uint32_t t_tid;
static __thread uint32_t t_api_block; /* 0: none claimed yet (or block 0 by fallback, see t_api_claimed) */
static __thread int t_api_claimed;

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint32_t tid(void)
{
	if (!t_tid)
		t_tid = (uint32_t)syscall(SYS_gettid); /* once per thread */
	return t_tid;
}

static inline uint32_t gen_of(uint64_t counter, uint32_t n)
{
	uint32_t g = (uint32_t)(counter / n) + 1u;
	return g ? g : 1u; /* 0 means "being filled" */
}

/* ---------------------------------------------------------------------- */
/* The ring: bounded multi-producer, one consumer (the control thread)     */
/* ---------------------------------------------------------------------- */

static void api_block_release(void *v);

__attribute__((constructor)) static void ring_init(void)
{
	for (uint32_t i = 0; i < N_CELLS; i++)
		atomic_store_explicit(&P.cells[i].seq, i, memory_order_relaxed);
	/* The destructor lives in this library, which is never unmapped (-z nodelete). */
	P.api_key_ok = pthread_key_create(&P.api_key, api_block_release) == 0;
}

/* Claims a cell; NULL when the ring is full (the caller counts the drop). */
static struct cell *ring_claim(uint64_t *pos_out)
{
	uint64_t pos = atomic_load_explicit(&P.enq, memory_order_relaxed);
	for (;;) {
		struct cell *c = &P.cells[pos & (N_CELLS - 1)];
		uint64_t seq = atomic_load_explicit(&c->seq, memory_order_acquire);
		int64_t dif = (int64_t)seq - (int64_t)pos;
		if (dif == 0) {
			if (atomic_compare_exchange_weak_explicit(&P.enq, &pos, pos + 1, memory_order_relaxed,
								  memory_order_relaxed)) {
				*pos_out = pos;
				return c;
			}
		} else if (dif < 0) {
			return NULL; /* full */
		} else {
			pos = atomic_load_explicit(&P.enq, memory_order_relaxed);
		}
	}
}

static void ring_publish(struct cell *c, uint64_t pos)
{
	atomic_store_explicit(&c->seq, pos + 1, memory_order_release);
}

/* ---------------------------------------------------------------------- */
/* NCCL strings -> enums, cached by pointer (NCCL passes string literals)  */
/* ---------------------------------------------------------------------- */

static int ieq(const char *a, const char *b)
{
	/* case-insensitive, '_' ignored in a: "NVLS_TREE" == "NVLSTree" */
	for (;;) {
		while (*a == '_')
			a++;
		char x = *a, y = *b;
		if (x >= 'A' && x <= 'Z')
			x = (char)(x - 'A' + 'a');
		if (y >= 'A' && y <= 'Z')
			y = (char)(y - 'A' + 'a');
		if (x != y)
			return 0;
		if (!x)
			return 1;
		a++, b++;
	}
}

static const char *const func_names[SLOWRANK_NCCL_FUNC_COUNT] = {
	"",         "Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce",
	"SendRecv", "Send",      "Recv",   "AlltoAll",  "Gather",        "Scatter",
};
static const char *const dt_names[SLOWRANK_NCCL_DT_COUNT] = {
	"",        "Int8",    "Uint8",   "Int32",    "Uint32",     "Int64",      "Uint64",
	"Float16", "Float32", "Float64", "Bfloat16", "Float8e4m3", "Float8e5m2",
};
static const char *const algo_names[SLOWRANK_NCCL_ALGO_COUNT] = {
	"", "Tree", "Ring", "CollNetDirect", "CollNetChain", "NVLS", "NVLSTree", "PAT",
};
static const char *const proto_names[SLOWRANK_NCCL_PROTO_COUNT] = {"", "LL", "LL128", "Simple"};

/* One direct-mapped cache per table: entry = pointer << 8 | id (user-space
 * pointers fit 56 bits), one atomic word, so readers never see a torn pair. */
#define STR_CACHE 64
struct str_map {
	const char *const *names;
	unsigned n;
	const char *prefix; /* stripped before comparing ("nccl" of datatypes) */
	_Atomic uint64_t cache[STR_CACHE];
};
static struct str_map m_func = {func_names, SLOWRANK_NCCL_FUNC_COUNT, NULL, {0}};
static struct str_map m_dt = {dt_names, SLOWRANK_NCCL_DT_COUNT, "nccl", {0}};
static struct str_map m_algo = {algo_names, SLOWRANK_NCCL_ALGO_COUNT, NULL, {0}};
static struct str_map m_proto = {proto_names, SLOWRANK_NCCL_PROTO_COUNT, NULL, {0}};

static uint8_t str_id(struct str_map *m, const char *s)
{
	if (!s)
		return 0;
	uint64_t p = (uint64_t)(uintptr_t)s;
	unsigned slot = (unsigned)((p >> 3) ^ (p >> 11)) & (STR_CACHE - 1);
	uint64_t e = atomic_load_explicit(&m->cache[slot], memory_order_relaxed);
	if (e && (e >> 8) == p)
		return (uint8_t)(e & 0xff);
	const char *t = s;
	if (m->prefix) {
		size_t pl = strlen(m->prefix);
		if (strncmp(t, m->prefix, pl) == 0)
			t += pl;
	}
	uint8_t id = 0;
	for (unsigned i = 1; i < m->n; i++)
		if (ieq(t, m->names[i])) {
			id = (uint8_t)i;
			break;
		}
	if (p < (1ull << 56))
		atomic_store_explicit(&m->cache[slot], (p << 8) | id, memory_order_relaxed);
	return id;
}

/* ---------------------------------------------------------------------- */
/* Event handling, shared by v4 and v5                                     */
/* ---------------------------------------------------------------------- */

static struct comm_slot *comm_of(void *ctx)
{
	uintptr_t p = (uintptr_t)ctx, lo = (uintptr_t)&P.comm[0], hi = (uintptr_t)&P.comm[N_COMM];
	if (p < lo || p >= hi || (p - lo) % sizeof(struct comm_slot) != 0)
		return NULL;
	struct comm_slot *c = (struct comm_slot *)ctx;
	return atomic_load_explicit(&c->state, memory_order_acquire) == COMM_LIVE ? c : NULL;
}

static void bad(void)
{
	atomic_fetch_add_explicit(&P.c_bad, 1, memory_order_relaxed);
}

/* A thread's exit gives its block back; the next owner continues its
 * counter, so handles of the old owner still fail the generation check. */
static void api_block_release(void *v)
{
	uint32_t b = (uint32_t)(uintptr_t)v;
	if (b >= 1 && b <= N_API_OWN)
		atomic_fetch_and_explicit(&P.api_owned, ~(1u << (b - 1)), memory_order_release);
}

/* The calling thread's block: claimed at its first API event (one CAS),
 * block 0 when all are owned or the key is missing. */
static uint32_t api_block_of_thread(void)
{
	if (t_api_claimed)
		return t_api_block;
	t_api_claimed = 1;
	t_api_block = 0;
	if (!P.api_key_ok)
		return 0;
	uint32_t cur = atomic_load_explicit(&P.api_owned, memory_order_relaxed);
	for (;;) {
		uint32_t free_bits = ~cur & ((1u << N_API_OWN) - 1u);
		if (!free_bits)
			return 0;
		uint32_t bit = free_bits & -free_bits;
		if (atomic_compare_exchange_weak_explicit(&P.api_owned, &cur, cur | bit, memory_order_acquire,
							  memory_order_relaxed)) {
			t_api_block = (uint32_t)__builtin_ctz(bit) + 1u;
			break;
		}
	}
	if (pthread_setspecific(P.api_key, (void *)(uintptr_t)t_api_block) != 0) {
		api_block_release((void *)(uintptr_t)t_api_block);
		t_api_block = 0;
	}
	return t_api_block;
}

static void *start_api(int p2p, const union sr_nccl_descr_u *u)
{
	uint32_t b = api_block_of_thread();
	uint64_t n = atomic_fetch_add_explicit(&P.api[b].next, 1, memory_order_relaxed);
	uint32_t idx = (uint32_t)(n % N_API), gen = gen_of(n, N_API);
	struct api_slot *a = &P.api[b].slot[idx];
	ST(a->gen, 0);
	int graph = p2p ? u->p2pApi.graphCaptured : u->collApi.graphCaptured;
	ST(a->flags, (uint16_t)(SLOWRANK_NCCL_F_API | (graph ? SLOWRANK_NCCL_F_GRAPH : 0)));
	ST(a->end_ns, 0);
	ST(a->start_ns, now_ns());
	__atomic_store_n(&a->gen, gen, __ATOMIC_RELEASE);
	return h_make(H_API, b, gen, idx);
}

/* The API slot named by handle h and its generation; NULL if h is not an
 * API handle. */
static struct api_slot *api_slot_of(const void *h, uint32_t *gen)
{
	unsigned kind, b;
	uint32_t idx;
	if (!h || !h_parse(h, &kind, &b, gen, &idx) || kind != H_API || b > N_API_OWN || idx >= N_API)
		return NULL;
	return &P.api[b].slot[idx];
}

static int is_api_handle(const void *h)
{
	unsigned kind, ch;
	uint32_t gen, idx;
	return h && h_parse(h, &kind, &ch, &gen, &idx) && kind == H_API;
}

/* Reads the API slot named by handle h (start, end, flags); 0 if it is gone. */
static int read_api(void *h, uint64_t *start, uint64_t *end, uint16_t *flags)
{
	uint32_t gen;
	struct api_slot *a = api_slot_of(h, &gen);
	if (!a || __atomic_load_n(&a->gen, __ATOMIC_ACQUIRE) != gen)
		return 0;
	*start = LD(a->start_ns);
	*end = LD(a->end_ns);
	*flags = LD(a->flags);
	__atomic_thread_fence(__ATOMIC_ACQUIRE);
	return __atomic_load_n(&a->gen, __ATOMIC_RELAXED) == gen;
}

/* Copies the parent API event's times into the operation now, at Coll
 * start: on NCCL's user thread, right after the calls of the group, so the
 * slot is still that call's (its thread's own block). An API event that has
 * not stopped yet leaves its handle for stop_op to read the end. A parent
 * that is an API handle but no longer readable is a lost join, counted. */
static void join_api(struct op_slot *o, void *parent)
{
	uint64_t as = 0, ae = 0;
	uint16_t af = 0;
	int ok = read_api(parent, &as, &ae, &af) && as != 0;
	if (!ok && is_api_handle(parent))
		atomic_fetch_add_explicit(&P.c_api_lost, 1, memory_order_relaxed);
	ST(o->api_start_ns, ok ? as : 0);
	ST(o->api_end_ns, ok ? ae : 0);
	ST(o->api_flags, ok ? af : (uint16_t)0);
	ST(o->api, ok && ae == 0 ? parent : NULL);
}

#define OP_COLL 0
#define OP_P2P 1
#define OP_CE 2 /* CeColl (v6): a collective on the copy engines */

static void *start_op(struct comm_slot *cs, int kind, void *parent, const union sr_nccl_descr_u *u)
{
	uint64_t n = atomic_fetch_add_explicit(&P.op_next, 1, memory_order_relaxed);
	uint32_t idx = (uint32_t)(n % N_OP), gen = gen_of(n, N_OP);
	struct op_slot *o = &P.op[idx];
	/* The previous occupant's channels never all reported. */
	uint64_t ks = atomic_load_explicit(&o->kstate, memory_order_relaxed);
	if ((ks & 0xffff) != 0 && !atomic_load_explicit(&o->kemitted, memory_order_relaxed))
		atomic_fetch_add_explicit(&P.c_incomplete, 1, memory_order_relaxed);
	ST(o->gen, 0);
	atomic_store_explicit(&o->kstate, (uint64_t)gen << 32, memory_order_relaxed);
	atomic_store_explicit(&o->kemitted, 0, memory_order_relaxed);
	atomic_store_explicit(&o->kstart, UINT64_MAX, memory_order_relaxed);
	atomic_store_explicit(&o->kend, 0, memory_order_relaxed);
	atomic_store_explicit(&o->kseen, 0, memory_order_relaxed);
	ST(o->comm_id, (uint32_t)(cs - P.comm));
	ST(o->comm_hash, cs->hash);
	ST(o->rank, cs->rank);
	ST(o->nranks, cs->nranks);
	ST(o->version, cs->version);
	join_api(o, parent);
	ST(o->tid, tid());
	if (kind == OP_P2P) {
		ST(o->func, str_id(&m_func, u->p2p.func));
		ST(o->dtype, str_id(&m_dt, u->p2p.datatype));
		ST(o->algo, (uint8_t)0);
		ST(o->proto, (uint8_t)0);
		ST(o->count, (uint64_t)u->p2p.count);
		ST(o->root, (int32_t)u->p2p.peer);
		ST(o->seq, (uint64_t)0);
		ST(o->nchannels, u->p2p.nChannels);
		ST(o->flags, (uint16_t)SLOWRANK_NCCL_F_P2P);
	} else if (kind == OP_CE) {
		ST(o->func, str_id(&m_func, u->ceColl.func));
		ST(o->dtype, str_id(&m_dt, u->ceColl.datatype));
		ST(o->algo, (uint8_t)0);
		ST(o->proto, (uint8_t)0);
		ST(o->count, (uint64_t)u->ceColl.count);
		ST(o->root, (int32_t)u->ceColl.root);
		ST(o->seq, u->ceColl.seqNumber);
		ST(o->nchannels, (uint8_t)0); /* no kernel, no KernelCh */
		ST(o->flags, (uint16_t)SLOWRANK_NCCL_F_CE);
	} else {
		ST(o->func, str_id(&m_func, u->coll.func));
		ST(o->dtype, str_id(&m_dt, u->coll.datatype));
		ST(o->algo, str_id(&m_algo, u->coll.algo));
		ST(o->proto, str_id(&m_proto, u->coll.proto));
		ST(o->count, (uint64_t)u->coll.count);
		ST(o->root, (int32_t)u->coll.root);
		ST(o->seq, u->coll.seqNumber);
		ST(o->nchannels, u->coll.nChannels);
		ST(o->flags, (uint16_t)0);
	}
	ST(o->launch_start_ns, now_ns());
	__atomic_store_n(&o->gen, gen, __ATOMIC_RELEASE);
	return h_make(H_OP, 0, gen, idx);
}

/* The API times joined at start; an end still unknown then is read now.
 * Without an end the record carries no API times (a half interval would
 * read as a zero-length call): counted as lost. */
static void api_times(struct op_slot *o, struct slowrank_nccl_coll_record *r)
{
	uint64_t as = LD(o->api_start_ns), ae = LD(o->api_end_ns);
	uint16_t af = LD(o->api_flags);
	void *pending = LD(o->api);
	if (af && pending) {
		uint64_t s2, e2;
		uint16_t f2;
		if (read_api(pending, &s2, &e2, &f2) && s2 == as)
			ae = e2;
		if (ae == 0) {
			atomic_fetch_add_explicit(&P.c_api_lost, 1, memory_order_relaxed);
			af = 0;
		}
	}
	if (!af)
		return;
	r->api_start_ns = as;
	r->api_end_ns = ae;
	r->flags |= af;
}

static void stop_op(struct op_slot *o, uint32_t gen)
{
	uint64_t pos;
	struct cell *c = ring_claim(&pos);
	if (!c) {
		atomic_fetch_add_explicit(&P.c_full, 1, memory_order_relaxed);
		return;
	}
	struct slowrank_nccl_coll_record *r = &c->r.coll;
	memset(r, 0, sizeof(*r));
	r->kind = SLOWRANK_REC_NCCL_COLL;
	r->size = sizeof(*r);
	r->func = LD(o->func);
	r->datatype = LD(o->dtype);
	r->algo = LD(o->algo);
	r->proto = LD(o->proto);
	r->comm_hash = LD(o->comm_hash);
	r->rank = LD(o->rank);
	r->nranks = LD(o->nranks);
	r->seq = LD(o->seq);
	r->count = LD(o->count);
	r->root = LD(o->root);
	r->flags = LD(o->flags);
	r->nchannels = LD(o->nchannels);
	r->version = LD(o->version);
	r->launch_start_ns = LD(o->launch_start_ns);
	r->launch_end_ns = now_ns();
	r->tid = LD(o->tid);
	r->comm_id = LD(o->comm_id);
	api_times(o, r);
	c->kind = SLOWRANK_REC_NCCL_COLL;
	if (__atomic_load_n(&o->gen, __ATOMIC_ACQUIRE) != gen) {
		/* reused under us (4096 operations later): the copy may mix two */
		r->kind = 0;
		c->kind = 0;
		bad();
	} else {
		atomic_fetch_add_explicit(&P.c_colls, 1, memory_order_relaxed);
	}
	ring_publish(c, pos);
}

/* The last expected channel stopped: queue the operation's GPU interval. */
static void emit_kernel(struct op_slot *o, unsigned stopped)
{
	uint64_t pos;
	struct cell *c = ring_claim(&pos);
	if (!c) {
		atomic_fetch_add_explicit(&P.c_full, 1, memory_order_relaxed);
		return;
	}
	struct slowrank_nccl_kernel_record *r = &c->r.kernel;
	memset(r, 0, sizeof(*r));
	r->kind = SLOWRANK_REC_NCCL_KERNEL;
	r->size = sizeof(*r);
	r->func = LD(o->func);
	r->flags = (uint8_t)(LD(o->flags) & SLOWRANK_NCCL_F_P2P);
	r->channels = (uint8_t)(stopped > 255 ? 255 : stopped);
	r->nchannels = LD(o->nchannels);
	if (r->nchannels != 0 && stopped < r->nchannels)
		r->flags |= SLOWRANK_NCCL_F_PARTIAL;
	r->comm_hash = LD(o->comm_hash);
	r->seq = LD(o->seq);
	r->rank = LD(o->rank);
	r->comm_id = LD(o->comm_id);
	uint64_t ks = atomic_load_explicit(&o->kstart, memory_order_relaxed);
	r->gpu_start_ns = ks == UINT64_MAX ? 0 : ks; /* raw: converted when drained */
	r->gpu_end_ns = atomic_load_explicit(&o->kend, memory_order_relaxed);
	r->host_seen_ns = atomic_load_explicit(&o->kseen, memory_order_relaxed);
	c->kind = SLOWRANK_REC_NCCL_KERNEL;
	atomic_fetch_add_explicit(&P.c_kernels, 1, memory_order_relaxed);
	ring_publish(c, pos);
}

static void atomic_min64(_Atomic uint64_t *p, uint64_t v)
{
	uint64_t cur = atomic_load_explicit(p, memory_order_relaxed);
	while (v < cur &&
	       !atomic_compare_exchange_weak_explicit(p, &cur, v, memory_order_relaxed, memory_order_relaxed))
		;
}

static void atomic_max64(_Atomic uint64_t *p, uint64_t v)
{
	uint64_t cur = atomic_load_explicit(p, memory_order_relaxed);
	while (v > cur &&
	       !atomic_compare_exchange_weak_explicit(p, &cur, v, memory_order_relaxed, memory_order_relaxed))
		;
}

/* Adds `add` (1: a channel started, 1 << 16: one stopped) to the slot's
 * channel state if it still belongs to gen; returns the new state or 0. */
static uint64_t kstate_add(struct op_slot *o, uint32_t gen, uint64_t add)
{
	uint64_t cur = atomic_load_explicit(&o->kstate, memory_order_relaxed);
	for (;;) {
		if ((uint32_t)(cur >> 32) != gen)
			return 0;
		if ((add == 1 && (cur & 0xffff) == 0xffff) || (add != 1 && ((cur >> 16) & 0xffff) == 0xffff))
			return 0; /* 65535 channels: not NCCL, never wrap into the generation */
		uint64_t next = cur + add;
		if (atomic_compare_exchange_weak_explicit(&o->kstate, &cur, next, memory_order_acq_rel,
							  memory_order_relaxed))
			return next;
	}
}

static struct op_slot *op_of(void *h, unsigned want_kind, unsigned *ch, uint32_t *gen)
{
	unsigned kind;
	uint32_t idx;
	if (!h || !h_parse(h, &kind, ch, gen, &idx) || kind != want_kind || idx >= N_OP)
		return NULL;
	struct op_slot *o = &P.op[idx];
	if (__atomic_load_n(&o->gen, __ATOMIC_ACQUIRE) != *gen)
		return NULL;
	return o;
}

static void *start_kch(void *parent, const union sr_nccl_descr_u *u)
{
	unsigned ch;
	uint32_t gen;
	struct op_slot *o = op_of(parent, H_OP, &ch, &gen);
	if (!o || !kstate_add(o, gen, 1)) {
		bad();
		return NULL; /* NCCL then makes no stop call for it */
	}
	if (u->kernelCh.pTimer)
		atomic_min64(&o->kstart, u->kernelCh.pTimer);
	return h_make(H_KCH, u->kernelCh.channelId, gen, (uint32_t)(o - P.op));
}

static sr_nccl_result_t start_event(void *ctx, void **handle, unsigned ver, uint64_t type, void *parent,
				    const union sr_nccl_descr_u *u)
{
	if (!handle)
		return SR_NCCL_SUCCESS;
	*handle = NULL;
	atomic_fetch_add_explicit(&P.c_events, 1, memory_order_relaxed);
	switch (type) {
	case SR_NCCL_PROFILE_COLL_API:
	case SR_NCCL_PROFILE_P2P_API:
		*handle = start_api(type == SR_NCCL_PROFILE_P2P_API, u);
		return SR_NCCL_SUCCESS;
	case SR_NCCL_PROFILE_COLL:
	case SR_NCCL_PROFILE_P2P:
	case SR_NCCL_PROFILE_CE_COLL: {
		struct comm_slot *cs = comm_of(ctx);
		if (!cs) {
			bad();
			return SR_NCCL_SUCCESS;
		}
		int kind = type == SR_NCCL_PROFILE_P2P ? OP_P2P : type == SR_NCCL_PROFILE_CE_COLL ? OP_CE : OP_COLL;
		if (kind == OP_CE && ver < 6) {
			/* no CE members in a v4/v5 descriptor (NCCL's shims drop CE events) */
			atomic_fetch_add_explicit(&P.c_unknown, 1, memory_order_relaxed);
			return SR_NCCL_SUCCESS;
		}
		*handle = start_op(cs, kind, parent, u);
		return SR_NCCL_SUCCESS;
	}
	case SR_NCCL_PROFILE_KERNEL_CH:
		*handle = start_kch(parent, u);
		return SR_NCCL_SUCCESS;
	case SR_NCCL_PROFILE_GROUP:
	case SR_NCCL_PROFILE_GROUP_API:
	case SR_NCCL_PROFILE_KERNEL_LAUNCH:
		/* Parents NCCL creates for the levels we asked for: a non-null
		 * handle keeps NCCL's own bookkeeping (it tests for one) as
		 * with any plugin. */
		*handle = h_make(H_IGNORED, 0, 1, 0);
		return SR_NCCL_SUCCESS;
	default:
		/* Proxy, net-plugin, CeSync/CeBatch and future types: never asked for. */
		atomic_fetch_add_explicit(&P.c_unknown, 1, memory_order_relaxed);
		return SR_NCCL_SUCCESS;
	}
}

static sr_nccl_result_t stop_event(void *h)
{
	unsigned kind, ch;
	uint32_t gen, idx;
	if (!h)
		return SR_NCCL_SUCCESS;
	if (!h_parse(h, &kind, &ch, &gen, &idx)) {
		bad();
		return SR_NCCL_SUCCESS;
	}
	switch (kind) {
	case H_IGNORED:
		return SR_NCCL_SUCCESS;
	case H_API: {
		struct api_slot *a = api_slot_of(h, &gen);
		if (!a || __atomic_load_n(&a->gen, __ATOMIC_ACQUIRE) != gen) {
			bad();
			return SR_NCCL_SUCCESS;
		}
		/* NCCL 2.28-2.30 never clear a thread's CollApi handle: every
		 * later collective append stops it again, also with the mask
		 * at 0. The call ended at the first stop; the others cost a
		 * load. */
		if (LD(a->end_ns) == 0)
			ST(a->end_ns, now_ns());
		return SR_NCCL_SUCCESS;
	}
	case H_OP: {
		struct op_slot *o = op_of(h, H_OP, &ch, &gen);
		if (!o) {
			bad();
			return SR_NCCL_SUCCESS;
		}
		stop_op(o, gen);
		return SR_NCCL_SUCCESS;
	}
	case H_KCH: {
		struct op_slot *o = op_of(h, H_KCH, &ch, &gen);
		uint64_t st = o ? kstate_add(o, gen, 1ull << 16) : 0;
		if (!st) {
			bad();
			return SR_NCCL_SUCCESS;
		}
		unsigned started = (unsigned)(st & 0xffff), stopped = (unsigned)((st >> 16) & 0xffff);
		unsigned expect = LD(o->nchannels);
		/* Exactly one stop sees the count reach the announced channels
		 * (or, when NCCL announced none, every started one). */
		if ((expect && stopped == expect) || (!expect && stopped == started)) {
			atomic_store_explicit(&o->kemitted, 1, memory_order_relaxed);
			emit_kernel(o, stopped);
		}
		return SR_NCCL_SUCCESS;
	}
	}
	bad();
	return SR_NCCL_SUCCESS;
}

static sr_nccl_result_t record_state(void *h, int state, sr_nccl_state_args_t *args)
{
	if (state != SR_NCCL_STATE_KERNEL_CH_STOP || !h)
		return SR_NCCL_SUCCESS;
	unsigned ch;
	uint32_t gen;
	struct op_slot *o = op_of(h, H_KCH, &ch, &gen);
	if (!o) {
		bad();
		return SR_NCCL_SUCCESS;
	}
	if (args && args->kernelCh.pTimer)
		atomic_max64(&o->kend, args->kernelCh.pTimer);
	atomic_max64(&o->kseen, now_ns());
	return SR_NCCL_SUCCESS;
}

/* ---------------------------------------------------------------------- */
/* init / finalize                                                         */
/* ---------------------------------------------------------------------- */

static int env_on(const char *name)
{
	const char *v = getenv(name);
	return v && *v && strcmp(v, "0") != 0 && strcmp(v, "false") != 0;
}

static void queue_comm(const struct comm_slot *cs, uint16_t id, uint8_t flags, uint64_t fin_ns)
{
	uint64_t pos;
	struct cell *c = ring_claim(&pos);
	if (!c) {
		atomic_fetch_add_explicit(&P.c_full, 1, memory_order_relaxed);
		return;
	}
	struct slowrank_nccl_comm_record *r = &c->r.comm;
	memset(r, 0, sizeof(*r));
	r->kind = SLOWRANK_REC_NCCL_COMM;
	r->size = sizeof(*r);
	r->version = cs->version;
	r->flags = flags;
	r->comm_id = id;
	r->comm_hash = cs->hash;
	r->rank = cs->rank;
	r->nranks = cs->nranks;
	r->nnodes = cs->nnodes;
	r->init_ns = cs->init_ns;
	r->finalize_ns = fin_ns;
	c->kind = SLOWRANK_REC_NCCL_COMM;
	ring_publish(c, pos);
}

/* The entry of P.masks for mask, taken or made (-1: no room). Caller
 * holds mask_mu and has just stored the current value into *mask. */
static int mask_register(int *mask)
{
	int fr = -1;
	for (int i = 0; i < N_MASKS; i++) {
		if (P.masks[i].refs > 0 && P.masks[i].ptr == mask) {
			P.masks[i].refs++;
			P.masks[i].written = *mask;
			return i;
		}
		if (P.masks[i].refs == 0 && fr < 0)
			fr = i;
	}
	if (fr >= 0)
		P.masks[fr] = (struct mask_ref){.ptr = mask, .refs = 1, .written = *mask};
	return fr;
}

static sr_nccl_result_t do_init(unsigned version, void **ctx, int *mask, uint64_t hash, int nnodes, int nranks,
				int rank)
{
	if (ctx)
		*ctx = NULL;
	if (env_on("SLOWRANK_NCCL_DISABLE") || env_on("SLOWRANK_CUPTI_DISABLE") || !sr_runtime_start_for_plugin()) {
		ST(slowrank_nccl_status.disabled, 1u);
		return SR_NCCL_INTERNAL_ERROR; /* NCCL continues without a plugin */
	}
	if (!ctx || !mask)
		return SR_NCCL_INTERNAL_ERROR;
	uint64_t now = now_ns();
	struct comm_slot *cs = NULL;
	for (uint32_t i = 0; i < N_COMM; i++) {
		int expect = COMM_FREE;
		if (atomic_compare_exchange_strong(&P.comm[i].state, &expect, COMM_BUSY)) {
			cs = &P.comm[i];
			break;
		}
	}
	pthread_mutex_lock(&P.mask_mu);
	/* NCCL stores whatever init leaves here into the process-wide mask:
	 * keep the one the control thread decided (0 until an agent attaches). */
	*mask = atomic_load(&P.desired);
	if (cs) {
		cs->mask = mask_register(mask);
		if (cs->mask < 0) {
			/* More copies of NCCL than entries: this one's mask could
			 * not be kept current, so it stays 0 (never recorded). */
			*mask = 0;
			atomic_store_explicit(&cs->state, COMM_FREE, memory_order_release);
			cs = NULL;
		}
	}
	atomic_store(&P.version, version);
	pthread_mutex_unlock(&P.mask_mu);
	ST(slowrank_nccl_status.api_version, version);
	if (LD(slowrank_nccl_status.first_init_ns) == 0)
		ST(slowrank_nccl_status.first_init_ns, now);
	__atomic_fetch_add(&slowrank_nccl_status.inits, 1, __ATOMIC_RELAXED);
	if (!cs) {
		/* Untracked: NCCL calls us with a NULL context, which records nothing. */
		atomic_fetch_add(&P.c_comm_overflow, 1);
		return SR_NCCL_SUCCESS;
	}
	cs->version = (uint8_t)version;
	cs->hash = hash;
	cs->rank = rank;
	cs->nranks = nranks;
	cs->nnodes = nnodes;
	cs->init_ns = now;
	atomic_store_explicit(&cs->state, COMM_LIVE, memory_order_release);
	atomic_fetch_add(&P.live, 1);
	atomic_fetch_add(&P.c_comms, 1);
	ST(slowrank_nccl_status.live_comms, (uint32_t)atomic_load(&P.live));
	queue_comm(cs, (uint16_t)(cs - P.comm), 0, 0);
	*ctx = cs;
	return SR_NCCL_SUCCESS;
}

static sr_nccl_result_t do_finalize(void *ctx)
{
	struct comm_slot *cs = comm_of(ctx);
	if (!cs) {
		if (ctx)
			bad();
		return SR_NCCL_SUCCESS;
	}
	queue_comm(cs, (uint16_t)(cs - P.comm), SLOWRANK_NCCL_COMM_F_FINALIZED, now_ns());
	int left = atomic_fetch_sub(&P.live, 1) - 1;
	ST(slowrank_nccl_status.live_comms, (uint32_t)(left < 0 ? 0 : left));
	pthread_mutex_lock(&P.mask_mu);
	/* NCCL may unload itself after its last comm: stop writing into its
	 * mask (another copy's stays current). */
	if (cs->mask >= 0 && --P.masks[cs->mask].refs == 0)
		P.masks[cs->mask].ptr = NULL;
	cs->mask = -1;
	/* Free the slot while holding the mask mutex: the control thread's
	 * re-send reads live slots under it too. */
	atomic_store_explicit(&cs->state, COMM_FREE, memory_order_release);
	pthread_mutex_unlock(&P.mask_mu);
	return SR_NCCL_SUCCESS;
}

/* v5 */
static sr_nccl_result_t v5_init(void **ctx, uint64_t comm_id, int *mask, const char *name, int nnodes, int nranks,
				int rank, sr_nccl_logger_t logfn)
{
	(void)name;
	(void)logfn;
	return do_init(5, ctx, mask, comm_id, nnodes, nranks, rank);
}

static sr_nccl_result_t v5_start(void *ctx, void **handle, sr_nccl_descr_v5_t *d)
{
	if (!d) {
		if (handle)
			*handle = NULL;
		return SR_NCCL_SUCCESS;
	}
	return start_event(ctx, handle, 5, d->type, d->parentObj, &d->u);
}

/* v6 (NCCL 2.29, 2.30): v5's calls, and CeColl events for collectives NCCL
 * runs on the copy engines (no Coll event for those). */
static sr_nccl_result_t v6_init(void **ctx, uint64_t comm_id, int *mask, const char *name, int nnodes, int nranks,
				int rank, sr_nccl_logger_t logfn)
{
	(void)name;
	(void)logfn;
	return do_init(6, ctx, mask, comm_id, nnodes, nranks, rank);
}

static sr_nccl_result_t v6_start(void *ctx, void **handle, sr_nccl_descr_v6_t *d)
{
	if (!d) {
		if (handle)
			*handle = NULL;
		return SR_NCCL_SUCCESS;
	}
	return start_event(ctx, handle, 6, d->type, d->parentObj, &d->u);
}

/* v4: `type` is one byte; no API events; Coll's parent is the Group. */
static sr_nccl_result_t v4_init(void **ctx, int *mask, const char *name, uint64_t hash, int nnodes, int nranks,
				int rank, sr_nccl_logger_t logfn)
{
	(void)name;
	(void)logfn;
	return do_init(4, ctx, mask, hash, nnodes, nranks, rank);
}

static sr_nccl_result_t v4_start(void *ctx, void **handle, sr_nccl_descr_v4_t *d)
{
	if (!d) {
		if (handle)
			*handle = NULL;
		return SR_NCCL_SUCCESS;
	}
	/* Read through the v5 view: every v4 field read lies at the same offset
	 * (nccl_profiler.h), none past v4's end (API events never come on v4). */
	return start_event(ctx, handle, 4, d->type, d->parentObj, (const union sr_nccl_descr_u *)(const void *)&d->u);
}

SR_EXPORT const sr_nccl_profiler_v6_t ncclProfiler_v6 = {
	.name = "slowrank",
	.init = v6_init,
	.startEvent = v6_start,
	.stopEvent = stop_event,
	.recordEventState = record_state,
	.finalize = do_finalize,
};

SR_EXPORT const sr_nccl_profiler_v5_t ncclProfiler_v5 = {
	.name = "slowrank",
	.init = v5_init,
	.startEvent = v5_start,
	.stopEvent = stop_event,
	.recordEventState = record_state,
	.finalize = do_finalize,
};

SR_EXPORT const sr_nccl_profiler_v4_t ncclProfiler_v4 = {
	.name = "slowrank",
	.init = v4_init,
	.startEvent = v4_start,
	.stopEvent = stop_event,
	.recordEventState = record_state,
	.finalize = do_finalize,
};

/* ---------------------------------------------------------------------- */
/* Control-thread side                                                     */
/* ---------------------------------------------------------------------- */

int sr_nccl_active(void)
{
	return atomic_load(&P.version) != 0;
}

void sr_nccl_set_mask(int attached, int kernel_on)
{
	unsigned v = atomic_load(&P.version);
	int m = 0;
	if (attached) {
		m = SLOWRANK_NCCL_MASK_COLL | SLOWRANK_NCCL_MASK_P2P;
		if (v >= 5)
			m |= SLOWRANK_NCCL_MASK_COLLAPI | SLOWRANK_NCCL_MASK_P2PAPI;
		if (v >= 6)
			m |= SLOWRANK_NCCL_MASK_CECOLL; /* not CeSync/CeBatch: a CE collective is one record */
		if (kernel_on)
			m |= SLOWRANK_NCCL_MASK_KERNELCH;
	}
	atomic_store(&P.desired, m);
	pthread_mutex_lock(&P.mask_mu);
	for (int i = 0; i < N_MASKS; i++) {
		struct mask_ref *r = &P.masks[i];
		if (r->refs == 0 || m == r->written)
			continue;
		/* One aligned int; NCCL copies it into each operation it enqueues
		 * (another writer, NCCL's RAS override, wins until ours changes). */
		__atomic_store_n(r->ptr, m, __ATOMIC_RELAXED);
		r->written = m;
	}
	pthread_mutex_unlock(&P.mask_mu);
	ST(slowrank_nccl_status.mask, (uint32_t)m);
}

void sr_nccl_calibrate(void)
{
	struct timespec a, r, b;
	uint64_t best = UINT64_MAX;
	int64_t off = 0;
	for (int i = 0; i < 5; i++) {
		clock_gettime(CLOCK_MONOTONIC, &a);
		clock_gettime(CLOCK_REALTIME, &r);
		clock_gettime(CLOCK_MONOTONIC, &b);
		uint64_t an = (uint64_t)a.tv_sec * 1000000000ull + (uint64_t)a.tv_nsec;
		uint64_t bn = (uint64_t)b.tv_sec * 1000000000ull + (uint64_t)b.tv_nsec;
		uint64_t rn = (uint64_t)r.tv_sec * 1000000000ull + (uint64_t)r.tv_nsec;
		if (bn - an < best) {
			best = bn - an;
			off = (int64_t)(an + (bn - an) / 2) - (int64_t)rn;
		}
	}
	atomic_store(&P.rt_offset, off);
	atomic_store(&P.rt_known, 1);
}

/* The GPU cannot end after the host saw it end: within
 * SLOWRANK_NCCL_CLOCK_SLACK_NS that is the offset's calibration error
 * (clamped, so consumers may rely on gpu_end_ns <= host_seen_ns), beyond it
 * a clock we do not understand (flagged, times kept as converted). */
static void bound_by_host(struct slowrank_nccl_kernel_record *r)
{
	if (!r->gpu_end_ns || !r->host_seen_ns || r->gpu_end_ns <= r->host_seen_ns)
		return;
	if (r->gpu_end_ns - r->host_seen_ns > SLOWRANK_NCCL_CLOCK_SLACK_NS) {
		r->flags |= SLOWRANK_NCCL_F_CLOCK_SUSPECT;
		atomic_fetch_add(&P.c_clock_suspect, 1);
		return;
	}
	r->gpu_end_ns = r->host_seen_ns;
	if (r->gpu_start_ns > r->gpu_end_ns)
		r->gpu_start_ns = r->gpu_end_ns;
	atomic_fetch_add(&P.c_clock_clamped, 1);
}

/* seen_offset: the smallest host_seen_ns - raw GPU end of the latest
 * SR_NCCL_LAG_N kernel records, r's included, when it lies within
 * SR_NCCL_SEEN_MAX_NS of prior; else prior. The plugin sees a channel's
 * stop a few µs after the GPU wrote it, so the smallest lag is the
 * GPU-to-monotonic offset plus the proxy's least latency: converted ends
 * are never after host_seen_ns and late by that latency at most. */
static int64_t seen_offset(const struct slowrank_nccl_kernel_record *r, int64_t prior)
{
	if (r->gpu_end_ns && r->host_seen_ns) {
		P.seen_lag[P.ilag] = (int64_t)(r->host_seen_ns - r->gpu_end_ns);
		P.ilag = (P.ilag + 1) % SR_NCCL_LAG_N;
		if (P.nlag < SR_NCCL_LAG_N)
			P.nlag++;
	}
	if (P.nlag == 0)
		return prior;
	int64_t best = P.seen_lag[0];
	for (uint32_t i = 1; i < P.nlag; i++)
		if (P.seen_lag[i] < best)
			best = P.seen_lag[i];
	int64_t d = best - prior;
	return d <= SR_NCCL_SEEN_MAX_NS && d >= -SR_NCCL_SEEN_MAX_NS ? best : prior;
}

/* Kernel-channel timers are GPU %globaltimer ns, which the driver keeps
 * near the CLOCK_REALTIME epoch, but not to the µs: on the H200 the
 * realtime offset put every end 0.43 ms before CUPTI's record of the same
 * kernel (bench/results, nccl-plugin-clock). So the realtime offset is
 * the prior, and the offset used is the one the host's sightings of the
 * ends show (seen_offset) where it lies near it. A timer that lands
 * implausibly far from now is taken as already monotonic-like (raw, prior
 * 0); a clock farther off than SR_NCCL_SEEN_MAX_NS keeps the prior, and a
 * GPU end after the host saw it is then clamped or flagged,
 * bound_by_host. */
static void convert_kernel(struct slowrank_nccl_kernel_record *r, uint64_t now)
{
	int64_t off = atomic_load(&P.rt_known) ? atomic_load(&P.rt_offset) : 0;
	uint64_t ref = r->gpu_end_ns ? r->gpu_end_ns : r->gpu_start_ns;
	if (ref) {
		uint64_t conv = ref + (uint64_t)off;
		uint64_t lo = now > 600000000000ull ? now - 600000000000ull : 0, hi = now + 60000000000ull;
		if ((conv < lo || conv > hi) && ref >= lo && ref <= hi)
			off = 0;
	}
	off = seen_offset(r, off);
	if (r->gpu_start_ns)
		r->gpu_start_ns += (uint64_t)off;
	if (r->gpu_end_ns)
		r->gpu_end_ns += (uint64_t)off;
	r->clock_offset_ns = off;
	bound_by_host(r);
}

static void append(struct slowrank_conv *c, const void *rec, uint16_t size)
{
	void *p = slowrank_conv_reserve(c, size);
	memcpy(p, rec, size);
}

uint32_t sr_nccl_drain(struct slowrank_conv *c, int attached, int resend, uint64_t now)
{
	uint32_t n = 0;
	if (resend && attached) {
		pthread_mutex_lock(&P.mask_mu);
		for (uint32_t i = 0; i < N_COMM; i++) {
			struct comm_slot *cs = &P.comm[i];
			if (atomic_load_explicit(&cs->state, memory_order_acquire) != COMM_LIVE)
				continue;
			struct slowrank_nccl_comm_record r;
			memset(&r, 0, sizeof(r));
			r.kind = SLOWRANK_REC_NCCL_COMM;
			r.size = sizeof(r);
			r.version = cs->version;
			r.flags = SLOWRANK_NCCL_COMM_F_RESENT;
			r.comm_id = (uint16_t)i;
			r.comm_hash = cs->hash;
			r.rank = cs->rank;
			r.nranks = cs->nranks;
			r.nnodes = cs->nnodes;
			r.init_ns = cs->init_ns;
			append(c, &r, sizeof(r));
			n++;
		}
		pthread_mutex_unlock(&P.mask_mu);
	}
	for (;;) {
		struct cell *cell = &P.cells[P.deq & (N_CELLS - 1)];
		uint64_t seq = atomic_load_explicit(&cell->seq, memory_order_acquire);
		if (seq != P.deq + 1)
			break; /* empty, or a producer between claim and publish */
		if (!attached || cell->kind == 0) {
			if (cell->kind != 0)
				atomic_fetch_add(&P.c_discarded, 1);
		} else if (cell->kind == SLOWRANK_REC_NCCL_KERNEL) {
			struct slowrank_nccl_kernel_record k = cell->r.kernel;
			convert_kernel(&k, now);
			append(c, &k, sizeof(k));
			n++;
		} else if (cell->kind == SLOWRANK_REC_NCCL_COLL) {
			append(c, &cell->r.coll, sizeof(cell->r.coll));
			n++;
		} else if (cell->kind == SLOWRANK_REC_NCCL_COMM) {
			append(c, &cell->r.comm, sizeof(cell->r.comm));
			n++;
		}
		atomic_store_explicit(&cell->seq, P.deq + N_CELLS, memory_order_release);
		P.deq++;
	}
	ST(slowrank_nccl_status.colls, atomic_load(&P.c_colls));
	ST(slowrank_nccl_status.dropped, atomic_load(&P.c_full) + atomic_load(&P.c_bad) + atomic_load(&P.c_incomplete));
	return n;
}

void sr_nccl_counters(uint64_t k[SLOWRANK_STAT_COUNT])
{
	k[SLOWRANK_STAT_NCCL_EVENTS] = atomic_load(&P.c_events);
	k[SLOWRANK_STAT_NCCL_COLLS] = atomic_load(&P.c_colls);
	k[SLOWRANK_STAT_NCCL_KERNELS] = atomic_load(&P.c_kernels);
	k[SLOWRANK_STAT_NCCL_RING_FULL] = atomic_load(&P.c_full);
	k[SLOWRANK_STAT_NCCL_DISCARDED] = atomic_load(&P.c_discarded);
	k[SLOWRANK_STAT_NCCL_BAD_HANDLES] = atomic_load(&P.c_bad);
	k[SLOWRANK_STAT_NCCL_INCOMPLETE] = atomic_load(&P.c_incomplete);
	k[SLOWRANK_STAT_NCCL_COMMS] = atomic_load(&P.c_comms);
	k[SLOWRANK_STAT_NCCL_COMM_OVERFLOW] = atomic_load(&P.c_comm_overflow);
	k[SLOWRANK_STAT_NCCL_CLOCK_SUSPECT] = atomic_load(&P.c_clock_suspect);
	k[SLOWRANK_STAT_NCCL_UNKNOWN_EVENTS] = atomic_load(&P.c_unknown);
	k[SLOWRANK_STAT_NCCL_API_LOST] = atomic_load(&P.c_api_lost);
	k[SLOWRANK_STAT_NCCL_CLOCK_CLAMPED] = atomic_load(&P.c_clock_clamped);
}
