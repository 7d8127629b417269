//go:build ignore

/*
 * slowrank_convert.c - CUPTI activity records -> slowrank batches (pure).
 * See slowrank_convert.h.
 */
#define _POSIX_C_SOURCE 200809L
#include "slowrank_convert.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------- */
/* Layout facts the converter relies on (stable since CUDA 9 / CUPTI 10).  */
/* ---------------------------------------------------------------------- */
#define SR_OFF(T, f) offsetof(T, f)
#define SR_END(T, f) (offsetof(T, f) + sizeof(((T *)0)->f))

typedef SLOWRANK_KERNEL_RECORD sr_kernel_t;
typedef SLOWRANK_MEMCPY_RECORD sr_memcpy_t;
typedef SLOWRANK_MEMSET_RECORD sr_memset_t;

_Static_assert(SR_OFF(sr_kernel_t, start) == 16, "kernel start");
_Static_assert(SR_OFF(sr_kernel_t, end) == 24, "kernel end");
_Static_assert(SR_OFF(sr_kernel_t, deviceId) == 40, "kernel deviceId");
_Static_assert(SR_OFF(sr_kernel_t, contextId) == 44, "kernel contextId");
_Static_assert(SR_OFF(sr_kernel_t, streamId) == 48, "kernel streamId");
_Static_assert(SR_OFF(sr_kernel_t, gridX) == 52, "kernel gridX");
_Static_assert(SR_OFF(sr_kernel_t, blockZ) == 72, "kernel blockZ");
_Static_assert(SR_OFF(sr_kernel_t, correlationId) == 92, "kernel correlationId");
_Static_assert(SR_OFF(sr_kernel_t, name) == 104, "kernel name");
_Static_assert(SR_OFF(sr_memcpy_t, bytes) == 8, "memcpy bytes");
_Static_assert(SR_OFF(sr_memcpy_t, start) == 16, "memcpy start");
_Static_assert(SR_OFF(sr_memcpy_t, correlationId) == 44, "memcpy correlationId");
_Static_assert(SR_OFF(sr_memset_t, bytes) == 8, "memset bytes");
_Static_assert(SR_OFF(sr_memset_t, start) == 16, "memset start");
_Static_assert(SR_OFF(sr_memset_t, correlationId) == 44, "memset correlationId");
_Static_assert(SR_OFF(sr_memset_t, memoryKind) == 50, "memset memoryKind");

/* Bytes of each CUPTI record the converter reads. */
#define SR_KERNEL_PREFIX SR_END(sr_kernel_t, name)
#define SR_MEMCPY_PREFIX SR_END(sr_memcpy_t, correlationId)
#define SR_MEMSET_PREFIX SR_END(sr_memset_t, memoryKind)

/* Longest name scanned for hashing/classification (CUPTI's names are C
 * strings; this only bounds a corrupt pointer's damage). */
#define SR_NAME_SCAN_MAX 16384
#define SR_TABLE_SIZE (2 * SLOWRANK_MAX_NAMES) /* power of two */
#define SR_PTRCACHE_SIZE 4096                  /* power of two */
#define SR_VERIFY_BYTES 32

struct name_entry {
	uint64_t hash;
	char *name; /* bounded copy, stored_len bytes */
	uint32_t full_len;
	uint32_t sent_epoch;
	uint16_t stored_len;
	uint8_t kclass;
	uint8_t truncated;
};

struct ptr_cache_entry {
	const char *ptr;
	uint32_t id;
};

struct slowrank_conv {
	struct slowrank_conv_config cfg;
	uint64_t seq;
	uint32_t epoch;
	int epoch_start_pending;
	int final_pending;
	uint16_t clock_source;
	int64_t clock_offset;
	uint64_t win_lo, win_hi; /* plausible CLOCK_MONOTONIC range, 0/0: unchecked */
	struct slowrank_clocks clocks;
	uint32_t clock_bracket;
	uint32_t generation;

	uint64_t counters[SLOWRANK_STAT_COUNT];
	uint64_t cupti_dropped;
	uint64_t lib_dropped;
	uint64_t records_emitted;

	struct name_entry *entries; /* index = name id; 0 unused */
	uint32_t nnames;
	uint32_t *table; /* name id or 0 */
	struct ptr_cache_entry ptrcache[SR_PTRCACHE_SIZE];

	uint32_t off;
	uint32_t count;
	_Alignas(8) uint8_t batch[SLOWRANK_BATCH_MAX];
};

/* ---------------------------------------------------------------------- */
/* Classification                                                          */
/* ---------------------------------------------------------------------- */

static inline int lower(int ch)
{
	return (ch >= 'A' && ch <= 'Z') ? ch + ('a' - 'A') : ch;
}

/* Case-insensitive substring search; needle is lower case. */
static int ci_has(const char *hay, size_t hlen, const char *needle)
{
	size_t nlen = strlen(needle);
	if (nlen == 0)
		return 1;
	if (hlen < nlen)
		return 0;
	for (size_t i = 0; i + nlen <= hlen; i++) {
		if (lower((unsigned char)hay[i]) != needle[0])
			continue;
		size_t j = 1;
		while (j < nlen && lower((unsigned char)hay[i + j]) == needle[j])
			j++;
		if (j == nlen)
			return 1;
	}
	return 0;
}

static int ci_any(const char *hay, size_t hlen, const char *const *needles)
{
	for (; *needles; needles++)
		if (ci_has(hay, hlen, *needles))
			return 1;
	return 0;
}

int slowrank_classify(const char *name, size_t len)
{
	static const char *const comm[] = {"nccldevkernel", "nvshmem",    "cross_device_reduce", "all_reduce",
					   "allreduce",     "all_gather", "allgather",           "reduce_scatter",
					   "reducescatter", NULL};
	static const char *const attn[] = {"flash", "fmha", "sdpa", "attention", "attn", NULL};
	static const char *const moe[] = {"grouped_gemm", "groupedgemm", "grouped_mm", "groupgemm", "moe",
					  "alltoall",     "all_to_all",  "all2all",    "expert",    NULL};
	static const char *const gemm[] = {"gemm",  "gemv",   "cutlass", "cublas",       "xmma",
					   "nvjet", "matmul", "wgmma",   "splitkreduce", NULL};
	static const char *const copy[] = {"copy", "memcpy", "memset", NULL};

	if (!name || len == 0)
		return SLOWRANK_CLASS_OTHER;
	if ((ci_has(name, len, "nccl") && ci_has(name, len, "kernel")) || ci_any(name, len, comm))
		return SLOWRANK_CLASS_COMMUNICATION;
	if (ci_any(name, len, attn))
		return SLOWRANK_CLASS_ATTENTION;
	if (ci_any(name, len, moe) || (ci_has(name, len, "permute") && ci_has(name, len, "token")))
		return SLOWRANK_CLASS_MOE;
	if (ci_any(name, len, gemm))
		return SLOWRANK_CLASS_GEMM;
	if (ci_any(name, len, copy))
		return SLOWRANK_CLASS_COPY;
	return SLOWRANK_CLASS_OTHER;
}

/* ---------------------------------------------------------------------- */
/* Converter state                                                         */
/* ---------------------------------------------------------------------- */

struct slowrank_conv *slowrank_conv_new(const struct slowrank_conv_config *cfg)
{
	struct slowrank_conv *c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	c->entries = calloc(SLOWRANK_MAX_NAMES + 1, sizeof(*c->entries));
	c->table = calloc(SR_TABLE_SIZE, sizeof(*c->table));
	if (!c->entries || !c->table) {
		free(c->entries);
		free(c->table);
		free(c);
		return NULL;
	}
	c->cfg = *cfg;
	c->epoch = 1;
	c->epoch_start_pending = 1;
	c->clock_source = SLOWRANK_CLOCK_UNKNOWN;
	c->off = sizeof(struct slowrank_batch_header);
	return c;
}

void slowrank_conv_free(struct slowrank_conv *c)
{
	if (!c)
		return;
	for (uint32_t i = 1; i <= c->nnames; i++)
		free(c->entries[i].name);
	free(c->entries);
	free(c->table);
	free(c);
}

void slowrank_conv_set_clock(struct slowrank_conv *c, uint16_t source, int64_t offset_ns, uint32_t bracket_ns)
{
	c->clock_source = source;
	c->clock_offset = offset_ns;
	c->clock_bracket = bracket_ns;
}

void slowrank_conv_set_generation(struct slowrank_conv *c, uint32_t generation)
{
	c->generation = generation;
}

void slowrank_conv_new_epoch(struct slowrank_conv *c)
{
	slowrank_conv_flush(c);
	c->epoch++;
	c->epoch_start_pending = 1;
}

void slowrank_conv_count(struct slowrank_conv *c, int stat, uint64_t delta)
{
	if (stat >= 0 && stat < SLOWRANK_STAT_COUNT)
		c->counters[stat] += delta;
}

void slowrank_conv_set_counter(struct slowrank_conv *c, int stat, uint64_t value)
{
	if (stat >= 0 && stat < SLOWRANK_STAT_COUNT)
		c->counters[stat] = value;
}

uint64_t slowrank_conv_counter(const struct slowrank_conv *c, int stat)
{
	return (stat >= 0 && stat < SLOWRANK_STAT_COUNT) ? c->counters[stat] : 0;
}

void slowrank_conv_add_cupti_dropped(struct slowrank_conv *c, uint64_t n)
{
	c->cupti_dropped += n;
}
void slowrank_conv_add_lib_dropped(struct slowrank_conv *c, uint64_t n)
{
	c->lib_dropped += n;
}
uint64_t slowrank_conv_cupti_dropped(const struct slowrank_conv *c)
{
	return c->cupti_dropped;
}
uint64_t slowrank_conv_lib_dropped(const struct slowrank_conv *c)
{
	return c->lib_dropped;
}
uint64_t slowrank_conv_records_emitted(const struct slowrank_conv *c)
{
	return c->records_emitted;
}

/* ---------------------------------------------------------------------- */
/* Batch building                                                          */
/* ---------------------------------------------------------------------- */

static inline uint32_t round8(uint32_t n)
{
	return (n + 7u) & ~7u;
}

void slowrank_conv_flush(struct slowrank_conv *c)
{
	if (c->count == 0 && !c->final_pending)
		return;
	struct slowrank_batch_header h;
	memset(&h, 0, sizeof(h));
	h.magic = SLOWRANK_BATCH_MAGIC;
	h.version = SLOWRANK_ABI_VERSION;
	h.flags = (uint16_t)((c->epoch_start_pending ? SLOWRANK_BATCH_F_EPOCH_START : 0) |
			     (c->final_pending ? SLOWRANK_BATCH_F_FINAL : 0));
	h.pid = c->cfg.pid;
	h.count = c->count;
	h.seq = ++c->seq;
	h.cupti_dropped = c->cupti_dropped;
	h.lib_dropped = c->lib_dropped;
	h.total_len = c->off;
	h.header_size = sizeof(h);
	h.clock_source = c->clock_source;
	h.clock_offset_ns = c->clock_offset;
	h.clock_bracket_ns = c->clock_bracket;
	h.generation = c->generation;
	memcpy(c->batch, &h, sizeof(h));

	c->counters[SLOWRANK_STAT_BATCHES]++;
	c->counters[SLOWRANK_STAT_BATCH_BYTES] += c->off;
	c->records_emitted += c->count;
	if (c->cfg.emit)
		c->cfg.emit(c->cfg.emit_user, c->batch, c->off);

	c->off = sizeof(h);
	c->count = 0;
	c->epoch_start_pending = 0;
	c->final_pending = 0;
}

/* Returns a zeroed record slot of size bytes (a multiple of 8), flushing the
 * open batch first when it does not fit. */
static void *reserve(struct slowrank_conv *c, uint32_t size)
{
	if (c->off + size > SLOWRANK_BATCH_MAX)
		slowrank_conv_flush(c);
	void *p = c->batch + c->off;
	memset(p, 0, size);
	c->off += size;
	c->count++;
	return p;
}

void *slowrank_conv_reserve(struct slowrank_conv *c, uint32_t size)
{
	return reserve(c, round8(size));
}

uint32_t slowrank_conv_pending(const struct slowrank_conv *c)
{
	return c->count;
}

static void ensure_space(struct slowrank_conv *c, uint32_t size)
{
	if (c->off + size > SLOWRANK_BATCH_MAX)
		slowrank_conv_flush(c);
}

/* ---------------------------------------------------------------------- */
/* Names                                                                   */
/* ---------------------------------------------------------------------- */

static uint64_t fnv1a(const char *s, size_t n)
{
	uint64_t h = 1469598103934665603ull;
	for (size_t i = 0; i < n; i++) {
		h ^= (unsigned char)s[i];
		h *= 1099511628211ull;
	}
	return h;
}

static inline uint32_t ptr_slot(const char *p)
{
	uintptr_t v = (uintptr_t)p;
	v ^= v >> 17;
	v *= 0x9e3779b97f4a7c15ull;
	return (uint32_t)(v >> 40) & (SR_PTRCACHE_SIZE - 1);
}

/* Returns the name id (0 when the table is full) and the class. */
static uint32_t intern(struct slowrank_conv *c, const char *name, uint8_t *kclass)
{
	if (!name) {
		*kclass = SLOWRANK_CLASS_OTHER;
		return 0;
	}
	struct ptr_cache_entry *pc = &c->ptrcache[ptr_slot(name)];
	if (pc->ptr == name && pc->id != 0) {
		struct name_entry *e = &c->entries[pc->id];
		size_t v = e->stored_len < SR_VERIFY_BYTES ? e->stored_len : SR_VERIFY_BYTES;
		if (memcmp(name, e->name, v) == 0 && (e->stored_len >= SR_VERIFY_BYTES || name[v] == 0)) {
			*kclass = e->kclass;
			return pc->id;
		}
	}

	size_t len = strnlen(name, SR_NAME_SCAN_MAX);
	uint64_t h = fnv1a(name, len);
	size_t stored = len < SLOWRANK_NAME_MAX ? len : SLOWRANK_NAME_MAX;
	uint32_t slot = (uint32_t)h & (SR_TABLE_SIZE - 1);
	for (;;) {
		uint32_t id = c->table[slot];
		if (id == 0)
			break;
		struct name_entry *e = &c->entries[id];
		if (e->hash == h && e->full_len == len && memcmp(e->name, name, stored) == 0) {
			pc->ptr = name;
			pc->id = id;
			*kclass = e->kclass;
			return id;
		}
		slot = (slot + 1) & (SR_TABLE_SIZE - 1);
	}

	int cls = slowrank_classify(name, len);
	*kclass = (uint8_t)cls;
	if (c->nnames >= SLOWRANK_MAX_NAMES) {
		c->counters[SLOWRANK_STAT_NAMES_OVERFLOW]++;
		return 0;
	}
	char *copy = malloc(stored ? stored : 1);
	if (!copy) {
		c->counters[SLOWRANK_STAT_NAMES_OVERFLOW]++;
		return 0;
	}
	memcpy(copy, name, stored);
	uint32_t id = ++c->nnames;
	struct name_entry *e = &c->entries[id];
	e->hash = h;
	e->name = copy;
	e->full_len = (uint32_t)len;
	e->stored_len = (uint16_t)stored;
	e->kclass = (uint8_t)cls;
	e->truncated = stored < len;
	e->sent_epoch = 0;
	c->table[slot] = id;
	pc->ptr = name;
	pc->id = id;
	c->counters[SLOWRANK_STAT_NAMES]++;
	return id;
}

static uint32_t name_record_size(const struct name_entry *e)
{
	return round8((uint32_t)sizeof(struct slowrank_name_record) + e->stored_len);
}

static void put_name(struct slowrank_conv *c, uint32_t id)
{
	struct name_entry *e = &c->entries[id];
	uint32_t size = name_record_size(e);
	struct slowrank_name_record *r = reserve(c, size);
	r->kind = SLOWRANK_REC_NAME;
	r->size = (uint16_t)size;
	r->len = e->stored_len;
	r->kclass = e->kclass;
	r->flags = e->truncated ? SLOWRANK_NAME_F_TRUNCATED : 0;
	r->name_id = id;
	r->full_len = e->full_len;
	memcpy((uint8_t *)r + sizeof(*r), e->name, e->stored_len);
	e->sent_epoch = c->epoch;
}

/* ---------------------------------------------------------------------- */
/* Records                                                                 */
/* ---------------------------------------------------------------------- */

void slowrank_conv_set_window(struct slowrank_conv *c, uint64_t lo_ns, uint64_t hi_ns)
{
	c->win_lo = lo_ns;
	c->win_hi = hi_ns;
}

void slowrank_conv_set_clocks(struct slowrank_conv *c, const struct slowrank_clocks *k)
{
	c->clocks = *k;
}

static int in_window(const struct slowrank_conv *c, uint64_t s, uint64_t e)
{
	return s >= c->win_lo && e <= c->win_hi;
}

/* Maps s, e from CLOCK_REALTIME or TSC ticks onto CLOCK_MONOTONIC when
 * they lie as near to that clock's now as records lie to ours. */
static int other_clock(const struct slowrank_conv *c, uint64_t s, uint64_t e, uint64_t *os, uint64_t *oe)
{
	const struct slowrank_clocks *k = &c->clocks;
	if (k->mono_ns == 0 || c->win_hi <= k->mono_ns)
		return 0;
	uint64_t past = k->mono_ns - c->win_lo, future = c->win_hi - k->mono_ns;
	if (k->real_ns > k->mono_ns && s + past >= k->real_ns && e <= k->real_ns + future) {
		uint64_t d = k->real_ns - k->mono_ns;
		if (s > d) {
			*os = s - d;
			*oe = e - d;
			return 1;
		}
	}
	if (k->tsc != 0 && k->tsc_per_ns > 0) {
		double lo = (double)k->tsc - (double)past * k->tsc_per_ns;
		double hi = (double)k->tsc + (double)future * k->tsc_per_ns;
		if ((double)s >= lo && (double)e <= hi) {
			double ms = (double)k->mono_ns - ((double)k->tsc - (double)s) / k->tsc_per_ns;
			double me = (double)k->mono_ns - ((double)k->tsc - (double)e) / k->tsc_per_ns;
			if (ms > 0 && me >= ms) {
				*os = (uint64_t)ms;
				*oe = (uint64_t)me;
				return 1;
			}
		}
	}
	return 0;
}

/* Maps a CUPTI timestamp pair to CLOCK_MONOTONIC: 1, or 0 when unusable,
 * -1 when outside the plausible window (another client's clock), -2 when
 * CUPTI left a timestamp 0 (a forced flush returned the record before its
 * work ran). */
static int map_times(struct slowrank_conv *c, uint64_t s, uint64_t e, uint64_t *os, uint64_t *oe)
{
	uint64_t raw_s = s, raw_e = e;
	if (s == 0 || e == 0)
		return -2;
	if (e < s)
		return 0;
	if (c->clock_offset != 0) {
		int64_t ms = (int64_t)s + c->clock_offset;
		int64_t me = (int64_t)e + c->clock_offset;
		s = ms > 0 ? (uint64_t)ms : 0;
		e = me > 0 ? (uint64_t)me : 0;
	}
	if (c->win_hi != 0 && (s == 0 || !in_window(c, s, e))) {
		if (!other_clock(c, raw_s, raw_e, os, oe))
			return -1;
		c->counters[SLOWRANK_STAT_CLOCK_CONVERTED]++;
		return 1;
	}
	if (s == 0 || e == 0)
		return 0;
	*os = s;
	*oe = e;
	return 1;
}

static void bad_record(struct slowrank_conv *c)
{
	c->counters[SLOWRANK_STAT_BAD_RECORDS]++;
	c->lib_dropped++;
}

/* A record map_times refused: bad (0), on another clock (-1), incomplete
 * (-2). */
static void refused_record(struct slowrank_conv *c, int why)
{
	if (why == -2) {
		c->counters[SLOWRANK_STAT_INCOMPLETE_RECORDS]++;
		c->lib_dropped++;
		return;
	}
	if (why < 0) {
		c->counters[SLOWRANK_STAT_FOREIGN_CLOCK]++;
		c->lib_dropped++;
		return;
	}
	bad_record(c);
}

static int put_kernel(struct slowrank_conv *c, const sr_kernel_t *k, int serial)
{
	uint64_t s, e;
	int mapped = map_times(c, k->start, k->end, &s, &e);
	if (mapped <= 0) {
		refused_record(c, mapped);
		return 0;
	}
	uint8_t kclass;
	uint32_t id = intern(c, k->name, &kclass);
	uint32_t need = sizeof(struct slowrank_kernel_record);
	int send_name = id != 0 && c->entries[id].sent_epoch != c->epoch;
	if (send_name)
		need += name_record_size(&c->entries[id]);
	ensure_space(c, need); /* the definition and its first use share a batch */
	if (send_name)
		put_name(c, id);
	struct slowrank_kernel_record *r = reserve(c, sizeof(*r));
	r->kind = SLOWRANK_REC_KERNEL;
	r->size = sizeof(*r);
	r->kclass = kclass;
	r->flags = serial ? SLOWRANK_KERNEL_F_SERIAL : 0;
	r->start_ns = s;
	r->end_ns = e;
	r->device = k->deviceId;
	r->context = k->contextId;
	r->stream = k->streamId;
	r->correlation = k->correlationId;
	r->grid_x = k->gridX;
	r->grid_y = k->gridY;
	r->grid_z = k->gridZ;
	r->block_x = k->blockX;
	r->block_y = k->blockY;
	r->block_z = k->blockZ;
	r->name_id = id;
	c->counters[SLOWRANK_STAT_KERNELS]++;
	return 1;
}

static int put_memcpy(struct slowrank_conv *c, const sr_memcpy_t *m)
{
	uint64_t s, e;
	int mapped = map_times(c, m->start, m->end, &s, &e);
	if (mapped <= 0) {
		refused_record(c, mapped);
		return 0;
	}
	struct slowrank_copy_record *r = reserve(c, sizeof(*r));
	r->kind = SLOWRANK_REC_MEMCPY;
	r->size = sizeof(*r);
	r->copy_kind = m->copyKind;
	r->src_kind = m->srcKind;
	r->dst_kind = m->dstKind;
	r->flags = m->flags;
	r->start_ns = s;
	r->end_ns = e;
	r->bytes = m->bytes;
	r->device = m->deviceId;
	r->context = m->contextId;
	r->stream = m->streamId;
	r->correlation = m->correlationId;
	c->counters[SLOWRANK_STAT_MEMCPYS]++;
	return 1;
}

static int put_memset(struct slowrank_conv *c, const sr_memset_t *m)
{
	uint64_t s, e;
	int mapped = map_times(c, m->start, m->end, &s, &e);
	if (mapped <= 0) {
		refused_record(c, mapped);
		return 0;
	}
	struct slowrank_copy_record *r = reserve(c, sizeof(*r));
	r->kind = SLOWRANK_REC_MEMSET;
	r->size = sizeof(*r);
	r->src_kind = (uint8_t)m->memoryKind;
	r->flags = (uint8_t)m->flags;
	r->start_ns = s;
	r->end_ns = e;
	r->bytes = m->bytes;
	r->device = m->deviceId;
	r->context = m->contextId;
	r->stream = m->streamId;
	r->correlation = m->correlationId;
	c->counters[SLOWRANK_STAT_MEMSETS]++;
	return 1;
}

size_t slowrank_convert_buffer(struct slowrank_conv *c, uint8_t *buf, size_t valid, slowrank_next_fn next,
			       void *next_user)
{
	size_t converted = 0;
	CUpti_Activity *rec = NULL;
	if (!buf || valid == 0 || !next)
		return 0;
	for (;;) {
		int st = next(next_user, buf, valid, &rec);
		if (st == SLOWRANK_NEXT_END)
			break;
		if (st != SLOWRANK_NEXT_OK || !rec) {
			bad_record(c);
			break;
		}
		uint8_t *p = (uint8_t *)rec;
		if (p < buf || p >= buf + valid || (size_t)(buf + valid - p) < sizeof(CUpti_ActivityKind)) {
			bad_record(c);
			break;
		}
		size_t avail = (size_t)(buf + valid - p);
		c->counters[SLOWRANK_STAT_RECORDS_SEEN]++;
		switch (rec->kind) {
		case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
		case CUPTI_ACTIVITY_KIND_KERNEL:
			if (avail < SR_KERNEL_PREFIX) {
				bad_record(c);
				goto out;
			}
			converted += put_kernel(c, (const sr_kernel_t *)rec, rec->kind == CUPTI_ACTIVITY_KIND_KERNEL);
			break;
		case CUPTI_ACTIVITY_KIND_MEMCPY:
			if (avail < SR_MEMCPY_PREFIX) {
				bad_record(c);
				goto out;
			}
			converted += put_memcpy(c, (const sr_memcpy_t *)rec);
			break;
		case CUPTI_ACTIVITY_KIND_MEMSET:
			if (avail < SR_MEMSET_PREFIX) {
				bad_record(c);
				goto out;
			}
			converted += put_memset(c, (const sr_memset_t *)rec);
			break;
		default:
			c->counters[SLOWRANK_STAT_UNKNOWN_KINDS]++;
			break;
		}
	}
out:
	slowrank_conv_flush(c);
	return converted;
}

void slowrank_conv_transition(struct slowrank_conv *c, int on, int reason, int mode, uint64_t ts_ns)
{
	struct slowrank_transition_record *r = reserve(c, sizeof(*r));
	r->kind = SLOWRANK_REC_TRANSITION;
	r->size = sizeof(*r);
	r->on = on ? 1 : 0;
	r->reason = (uint8_t)reason;
	r->mode = (uint16_t)mode;
	r->timestamp = ts_ns;
	slowrank_conv_flush(c);
}

void slowrank_conv_stats(struct slowrank_conv *c, int final)
{
	uint32_t size = (uint32_t)(sizeof(struct slowrank_stats_record) + 8u * SLOWRANK_STAT_COUNT);
	ensure_space(c, size);
	/* Count this batch before the snapshot so the record includes itself. */
	uint8_t *p = reserve(c, size);
	struct slowrank_stats_record *r = (struct slowrank_stats_record *)p;
	r->kind = SLOWRANK_REC_STATS;
	r->size = (uint16_t)size;
	r->n = SLOWRANK_STAT_COUNT;
	uint64_t snap[SLOWRANK_STAT_COUNT];
	memcpy(snap, c->counters, sizeof(snap));
	snap[SLOWRANK_STAT_BATCHES] += 1;
	snap[SLOWRANK_STAT_BATCH_BYTES] += c->off;
	memcpy(p + sizeof(*r), snap, sizeof(snap));
	if (final)
		c->final_pending = 1;
	slowrank_conv_flush(c);
}
