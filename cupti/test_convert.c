//go:build ignore

/*
 * test_convert.c - unit tests of the record conversion with synthetic CUPTI
 * buffers made from the real CUPTI header structs.
 *
 * Usage: test_convert [TESTDATA_DIR]
 * With a directory, writes TESTDATA_DIR/converter.batches ([u32 len][batch]...)
 * and Go fuzz seeds TESTDATA_DIR/fuzz/FuzzDecodeBatch/converter-*.
 */
#define _GNU_SOURCE
#include "slowrank_convert.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int failures, checks;

#define CHECK(cond)                                                                              \
	do {                                                                                     \
		checks++;                                                                        \
		if (!(cond)) {                                                                   \
			failures++;                                                              \
			fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
		}                                                                                \
	} while (0)

#define CHECK_EQ(a, b)                                                                                               \
	do {                                                                                                         \
		checks++;                                                                                            \
		unsigned long long a_ = (unsigned long long)(a), b_ = (unsigned long long)(b);                       \
		if (a_ != b_) {                                                                                      \
			failures++;                                                                                  \
			fprintf(stderr, "%s:%d: %s == %llu, want %s == %llu\n", __FILE__, __LINE__, #a, a_, #b, b_); \
		}                                                                                                    \
	} while (0)

/* ---------------------------------------------------------------------- */
/* Synthetic CUPTI buffers                                                 */
/* ---------------------------------------------------------------------- */

/* A kernel record as a newer CUPTI writes it: the old prefix plus more fields. */
typedef struct {
	CUpti_ActivityKernel4 k;
	uint8_t newer_fields[88];
} fat_kernel;

typedef struct {
	CUpti_ActivityMemcpy m;
	uint8_t newer_fields[24];
} fat_memcpy;

typedef struct {
	CUpti_ActivityMemset m;
	uint8_t newer_fields[24];
} fat_memset;

#define BOGUS_KIND ((CUpti_ActivityKind)0x7ffe)
#define BOGUS_SIZE 40

static size_t rec_size(CUpti_ActivityKind kind)
{
	size_t n;
	switch (kind) {
	case CUPTI_ACTIVITY_KIND_KERNEL:
	case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
		n = sizeof(fat_kernel);
		break;
	case CUPTI_ACTIVITY_KIND_MEMCPY:
		n = sizeof(fat_memcpy);
		break;
	case CUPTI_ACTIVITY_KIND_MEMSET:
		n = sizeof(fat_memset);
		break;
	case CUPTI_ACTIVITY_KIND_NAME:
		n = sizeof(CUpti_ActivityName);
		break;
	default:
		n = BOGUS_SIZE;
	}
	return (n + 7) & ~(size_t)7;
}

/* Walks like cuptiActivityGetNextRecord: sizes come from the kind. */
static int synth_next(void *user, uint8_t *buf, size_t valid, CUpti_Activity **rec)
{
	(void)user;
	size_t off = 0;
	if (*rec)
		off = (size_t)((uint8_t *)*rec - buf) + rec_size((*rec)->kind);
	if (off + sizeof(CUpti_ActivityKind) > valid)
		return SLOWRANK_NEXT_END;
	*rec = (CUpti_Activity *)(buf + off);
	return SLOWRANK_NEXT_OK;
}

struct synth {
	_Alignas(8) uint8_t buf[1 << 20];
	size_t len;
};

static void *synth_add(struct synth *s, CUpti_ActivityKind kind)
{
	size_t n = rec_size(kind);
	if (s->len + n > sizeof(s->buf)) {
		fprintf(stderr, "synthetic buffer full\n");
		exit(2);
	}
	void *p = s->buf + s->len;
	memset(p, 0, n);
	s->len += n;
	*(CUpti_ActivityKind *)p = kind;
	return p;
}

static CUpti_ActivityKernel4 *add_kernel(struct synth *s, const char *name, uint64_t start, uint64_t end, uint32_t corr)
{
	fat_kernel *fk = synth_add(s, CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
	CUpti_ActivityKernel4 *k = &fk->k;
	k->start = start;
	k->end = end;
	k->completed = end;
	k->deviceId = 3;
	k->contextId = 1;
	k->streamId = 7;
	k->gridX = 128;
	k->gridY = 2;
	k->gridZ = 1;
	k->blockX = 256;
	k->blockY = 1;
	k->blockZ = 1;
	k->correlationId = corr;
	k->name = name;
	return k;
}

/* ---------------------------------------------------------------------- */
/* Capturing and decoding emitted batches                                  */
/* ---------------------------------------------------------------------- */

#define MAX_BATCHES 4096

struct capture {
	int n;
	uint32_t len[MAX_BATCHES];
	uint8_t *data[MAX_BATCHES];
};

static void capture_emit(void *user, const void *batch, uint32_t len)
{
	struct capture *c = user;
	if (c->n >= MAX_BATCHES) {
		fprintf(stderr, "too many batches\n");
		exit(2);
	}
	c->data[c->n] = malloc(len);
	memcpy(c->data[c->n], batch, len);
	c->len[c->n] = len;
	c->n++;
}

static void capture_reset(struct capture *c)
{
	for (int i = 0; i < c->n; i++)
		free(c->data[i]);
	c->n = 0;
}

/* Flattened view of the records of captured batches. */
struct rec_view {
	int batch;
	uint16_t kind;
	const uint8_t *p;
};

struct decoded {
	int n;
	struct rec_view r[65536];
};

/* Validates every captured batch and flattens its records. */
static void decode_all(const struct capture *c, struct decoded *d, uint64_t first_seq)
{
	d->n = 0;
	for (int b = 0; b < c->n; b++) {
		const uint8_t *p = c->data[b];
		struct slowrank_batch_header h;
		CHECK(c->len[b] >= sizeof(h));
		CHECK(c->len[b] <= SLOWRANK_BATCH_MAX);
		memcpy(&h, p, sizeof(h));
		CHECK_EQ(h.magic, SLOWRANK_BATCH_MAGIC);
		CHECK_EQ(h.version, SLOWRANK_ABI_VERSION);
		CHECK_EQ(h.total_len, c->len[b]);
		CHECK_EQ(h.header_size, sizeof(h));
		CHECK_EQ(h.pid, 4242);
		CHECK_EQ(h.seq, first_seq + (uint64_t)b);
		CHECK(h.count > 0);
		uint32_t off = h.header_size;
		for (uint32_t i = 0; i < h.count; i++) {
			struct slowrank_record_header rh;
			CHECK(off + sizeof(rh) <= h.total_len);
			if (off + sizeof(rh) > h.total_len)
				break;
			memcpy(&rh, p + off, sizeof(rh));
			CHECK(rh.size >= SLOWRANK_RECORD_MIN);
			CHECK_EQ(rh.size % SLOWRANK_RECORD_ALIGN, 0);
			CHECK(off + rh.size <= h.total_len);
			if (rh.size < SLOWRANK_RECORD_MIN || off + rh.size > h.total_len)
				break;
			if (d->n < (int)(sizeof(d->r) / sizeof(d->r[0])))
				d->r[d->n++] = (struct rec_view){.batch = b, .kind = rh.kind, .p = p + off};
			off += rh.size;
		}
		CHECK_EQ(off, h.total_len);
	}
}

static const struct slowrank_batch_header *hdr(const struct capture *c, int b)
{
	return (const struct slowrank_batch_header *)c->data[b];
}

static struct slowrank_conv *new_conv(struct capture *cap)
{
	struct slowrank_conv_config cfg = {.pid = 4242, .emit = capture_emit, .emit_user = cap};
	struct slowrank_conv *c = slowrank_conv_new(&cfg);
	if (!c) {
		fprintf(stderr, "slowrank_conv_new failed\n");
		exit(2);
	}
	slowrank_conv_set_clock(c, SLOWRANK_CLOCK_MONOTONIC_CALLBACK, 0, 0);
	return c;
}

static struct synth S;
static struct capture CAP;
static struct decoded D;

/* ---------------------------------------------------------------------- */
/* Output for the Go tests                                                 */
/* ---------------------------------------------------------------------- */

static const char *outdir;
static FILE *batches_out;
static int seeds_written;

static void mkdir_p(const char *path)
{
	char tmp[4096];
	snprintf(tmp, sizeof(tmp), "%s", path);
	for (char *p = tmp + 1; *p; p++) {
		if (*p == '/') {
			*p = 0;
			mkdir(tmp, 0755);
			*p = '/';
		}
	}
	mkdir(tmp, 0755);
}

static void save_batches(const struct capture *c, const char *tag)
{
	if (!outdir)
		return;
	if (!batches_out) {
		char path[4096];
		mkdir_p(outdir);
		snprintf(path, sizeof(path), "%s/converter.batches", outdir);
		batches_out = fopen(path, "wb");
		if (!batches_out) {
			fprintf(stderr, "open %s: %s\n", path, strerror(errno));
			exit(2);
		}
	}
	char dir[4096];
	snprintf(dir, sizeof(dir), "%s/fuzz/FuzzDecodeBatch", outdir);
	mkdir_p(dir);
	for (int b = 0; b < c->n; b++) {
		fwrite(&c->len[b], sizeof(uint32_t), 1, batches_out);
		fwrite(c->data[b], 1, c->len[b], batches_out);
		if (b >= 2)
			continue; /* two seeds per case are plenty */
		char path[4200];
		snprintf(path, sizeof(path), "%s/converter-%s-%d", dir, tag, b);
		FILE *f = fopen(path, "w");
		if (!f) {
			fprintf(stderr, "open %s: %s\n", path, strerror(errno));
			exit(2);
		}
		fputs("go test fuzz v1\n[]byte(\"", f);
		for (uint32_t i = 0; i < c->len[b]; i++)
			fprintf(f, "\\x%02x", c->data[b][i]);
		fputs("\")\n", f);
		fclose(f);
		seeds_written++;
	}
}

/* ---------------------------------------------------------------------- */
/* Tests                                                                   */
/* ---------------------------------------------------------------------- */

static const char NCCL[] = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)";
static const char FLASH[] =
	"void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 64, 64, 4, false>, true>(Flash_fwd_params)";
static const char GEMM[] =
	"sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas";
static const char MOE[] = "void cutlass::Kernel<cutlass_grouped_gemm_moe_sm90>(Params)";
static const char COPY[] =
	"void at::native::(anonymous namespace)::CatArrayBatchedCopy<float, unsigned int, 4, 128, 1>(...)";
static const char OTHER[] =
	"void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, at::detail::Array<char*, 1> >(int, at::native::FillFunctor<float>, at::detail::Array<char*, 1>)";

static void test_basic(void)
{
	capture_reset(&CAP);
	S.len = 0;
	struct slowrank_conv *c = new_conv(&CAP);

	add_kernel(&S, NCCL, 1000, 5000, 11);
	add_kernel(&S, FLASH, 2000, 3000, 12);
	add_kernel(&S, GEMM, 3000, 4000, 13);
	CUpti_ActivityKernel4 *serial = add_kernel(&S, MOE, 4000, 4500, 14);
	serial->kind = CUPTI_ACTIVITY_KIND_KERNEL;
	add_kernel(&S, COPY, 4500, 4600, 15);
	add_kernel(&S, OTHER, 4600, 4700, 16);
	/* Same name again, from a different pointer: interned once. */
	static char gemm_copy[sizeof(GEMM)];
	memcpy(gemm_copy, GEMM, sizeof(GEMM));
	add_kernel(&S, gemm_copy, 5000, 6000, 17);
	/* Invalid timestamps: dropped and counted. */
	add_kernel(&S, GEMM, 7000, 6999, 18);
	add_kernel(&S, GEMM, 0, 10, 19);

	fat_memcpy *mc = synth_add(&S, CUPTI_ACTIVITY_KIND_MEMCPY);
	mc->m.copyKind = CUPTI_ACTIVITY_MEMCPY_KIND_HTOD;
	mc->m.srcKind = CUPTI_ACTIVITY_MEMORY_KIND_PINNED;
	mc->m.dstKind = CUPTI_ACTIVITY_MEMORY_KIND_DEVICE;
	mc->m.flags = CUPTI_ACTIVITY_FLAG_MEMCPY_ASYNC;
	mc->m.bytes = 1 << 20;
	mc->m.start = 8000;
	mc->m.end = 9000;
	mc->m.deviceId = 3;
	mc->m.contextId = 1;
	mc->m.streamId = 9;
	mc->m.correlationId = 21;

	fat_memset *ms = synth_add(&S, CUPTI_ACTIVITY_KIND_MEMSET);
	ms->m.value = 0;
	ms->m.bytes = 4096;
	ms->m.start = 9000;
	ms->m.end = 9100;
	ms->m.deviceId = 3;
	ms->m.contextId = 1;
	ms->m.streamId = 9;
	ms->m.correlationId = 22;
	ms->m.memoryKind = CUPTI_ACTIVITY_MEMORY_KIND_DEVICE;

	/* Kinds the converter does not handle: skipped and counted. */
	CUpti_ActivityName *nm = synth_add(&S, CUPTI_ACTIVITY_KIND_NAME);
	nm->name = "a thread name";
	synth_add(&S, BOGUS_KIND);

	size_t n = slowrank_convert_buffer(c, S.buf, S.len, synth_next, NULL);
	CHECK_EQ(n, 9); /* 7 kernels + memcpy + memset */
	CHECK_EQ(CAP.n, 1);
	decode_all(&CAP, &D, 1);
	CHECK(hdr(&CAP, 0)->flags & SLOWRANK_BATCH_F_EPOCH_START);
	CHECK_EQ(hdr(&CAP, 0)->lib_dropped, 2);
	CHECK_EQ(hdr(&CAP, 0)->clock_source, SLOWRANK_CLOCK_MONOTONIC_CALLBACK);
	CHECK_EQ(hdr(&CAP, 0)->count, 6 + 9);

	static const int want_class[] = {SLOWRANK_CLASS_COMMUNICATION, SLOWRANK_CLASS_ATTENTION, SLOWRANK_CLASS_GEMM,
					 SLOWRANK_CLASS_MOE,           SLOWRANK_CLASS_COPY,      SLOWRANK_CLASS_OTHER,
					 SLOWRANK_CLASS_GEMM};
	static const char *const want_name[] = {NCCL, FLASH, GEMM, MOE, COPY, OTHER, GEMM};
	int names = 0, kernels = 0, memcpys = 0, memsets = 0;
	uint32_t defined[64] = {0};
	for (int i = 0; i < D.n; i++) {
		const uint8_t *p = D.r[i].p;
		switch (D.r[i].kind) {
		case SLOWRANK_REC_NAME: {
			const struct slowrank_name_record *r = (const void *)p;
			CHECK(r->name_id > 0 && r->name_id < 64);
			CHECK_EQ(r->flags, 0);
			CHECK_EQ(r->len, r->full_len);
			defined[r->name_id] = 1;
			names++;
			break;
		}
		case SLOWRANK_REC_KERNEL: {
			const struct slowrank_kernel_record *r = (const void *)p;
			CHECK_EQ(r->size, sizeof(*r));
			CHECK(r->name_id > 0 && r->name_id < 64 && defined[r->name_id]);
			CHECK_EQ(r->kclass, want_class[kernels]);
			CHECK_EQ(r->device, 3);
			CHECK_EQ(r->stream, 7);
			CHECK_EQ(r->grid_x, 128);
			CHECK_EQ(r->grid_y, 2);
			CHECK_EQ(r->block_x, 256);
			CHECK_EQ(r->correlation, 11 + kernels);
			CHECK_EQ(r->flags, kernels == 3 ? SLOWRANK_KERNEL_F_SERIAL : 0);
			CHECK(r->end_ns > r->start_ns);
			/* The name definition before it carries the right bytes. */
			for (int j = 0; j < i; j++) {
				const struct slowrank_name_record *nr = (const void *)D.r[j].p;
				if (D.r[j].kind == SLOWRANK_REC_NAME && nr->name_id == r->name_id) {
					CHECK_EQ(nr->len, strlen(want_name[kernels]));
					CHECK(memcmp((const uint8_t *)nr + sizeof(*nr), want_name[kernels], nr->len) ==
					      0);
					CHECK_EQ(nr->kclass, want_class[kernels]);
				}
			}
			kernels++;
			break;
		}
		case SLOWRANK_REC_MEMCPY: {
			const struct slowrank_copy_record *r = (const void *)p;
			CHECK_EQ(r->bytes, 1 << 20);
			CHECK_EQ(r->copy_kind, CUPTI_ACTIVITY_MEMCPY_KIND_HTOD);
			CHECK_EQ(r->src_kind, CUPTI_ACTIVITY_MEMORY_KIND_PINNED);
			CHECK_EQ(r->dst_kind, CUPTI_ACTIVITY_MEMORY_KIND_DEVICE);
			CHECK_EQ(r->start_ns, 8000);
			CHECK_EQ(r->end_ns, 9000);
			CHECK_EQ(r->stream, 9);
			CHECK_EQ(r->correlation, 21);
			memcpys++;
			break;
		}
		case SLOWRANK_REC_MEMSET: {
			const struct slowrank_copy_record *r = (const void *)p;
			CHECK_EQ(r->bytes, 4096);
			CHECK_EQ(r->src_kind, CUPTI_ACTIVITY_MEMORY_KIND_DEVICE);
			CHECK_EQ(r->correlation, 22);
			memsets++;
			break;
		}
		default:
			CHECK(!"unexpected record kind");
		}
	}
	CHECK_EQ(names, 6);
	CHECK_EQ(kernels, 7);
	CHECK_EQ(memcpys, 1);
	CHECK_EQ(memsets, 1);
	CHECK_EQ(slowrank_conv_counter(c, SLOWRANK_STAT_RECORDS_SEEN), 13);
	CHECK_EQ(slowrank_conv_counter(c, SLOWRANK_STAT_UNKNOWN_KINDS), 2);
	CHECK_EQ(slowrank_conv_counter(c, SLOWRANK_STAT_BAD_RECORDS), 1);        /* ends before it starts */
	CHECK_EQ(slowrank_conv_counter(c, SLOWRANK_STAT_INCOMPLETE_RECORDS), 1); /* start 0 */
	CHECK_EQ(slowrank_conv_counter(c, SLOWRANK_STAT_NAMES), 6);
	CHECK_EQ(slowrank_conv_lib_dropped(c), 2);
	save_batches(&CAP, "basic");

	/* Converting the same names again sends no definition. */
	capture_reset(&CAP);
	S.len = 0;
	add_kernel(&S, NCCL, 10000, 11000, 30);
	add_kernel(&S, gemm_copy, 11000, 12000, 31);
	slowrank_convert_buffer(c, S.buf, S.len, synth_next, NULL);
	CHECK_EQ(CAP.n, 1);
	decode_all(&CAP, &D, 2);
	CHECK_EQ(D.n, 2);
	CHECK_EQ(D.r[0].kind, SLOWRANK_REC_KERNEL);
	CHECK_EQ(D.r[1].kind, SLOWRANK_REC_KERNEL);
	CHECK_EQ(hdr(&CAP, 0)->flags, 0);

	/* A new attach epoch re-sends the names in use, flagged. */
	capture_reset(&CAP);
	slowrank_conv_new_epoch(c);
	slowrank_conv_set_generation(c, 6);
	slowrank_convert_buffer(c, S.buf, S.len, synth_next, NULL);
	CHECK_EQ(CAP.n, 1);
	decode_all(&CAP, &D, 3);
	CHECK_EQ(D.n, 4);
	CHECK_EQ(D.r[0].kind, SLOWRANK_REC_NAME);
	CHECK_EQ(D.r[1].kind, SLOWRANK_REC_KERNEL);
	CHECK_EQ(D.r[2].kind, SLOWRANK_REC_NAME);
	CHECK(hdr(&CAP, 0)->flags & SLOWRANK_BATCH_F_EPOCH_START);
	CHECK_EQ(hdr(&CAP, 0)->generation, 6);
	slowrank_conv_free(c);
	capture_reset(&CAP);
}

static void test_clock_offset(void)
{
	capture_reset(&CAP);
	S.len = 0;
	struct slowrank_conv *c = new_conv(&CAP);
	slowrank_conv_set_clock(c, SLOWRANK_CLOCK_CALIBRATED, -1000, 75);
	add_kernel(&S, GEMM, 5000, 6000, 1);
	add_kernel(&S, GEMM, 500, 600, 2); /* would go negative: dropped */
	slowrank_convert_buffer(c, S.buf, S.len, synth_next, NULL);
	CHECK_EQ(CAP.n, 1);
	decode_all(&CAP, &D, 1);
	CHECK_EQ(hdr(&CAP, 0)->clock_source, SLOWRANK_CLOCK_CALIBRATED);
	CHECK_EQ(hdr(&CAP, 0)->clock_offset_ns, (uint64_t)-1000);
	CHECK_EQ(hdr(&CAP, 0)->clock_bracket_ns, 75);
	CHECK_EQ(D.n, 2);
	const struct slowrank_kernel_record *k = (const void *)D.r[1].p;
	CHECK_EQ(k->start_ns, 4000);
	CHECK_EQ(k->end_ns, 5000);
	CHECK_EQ(slowrank_conv_lib_dropped(c), 1);
	slowrank_conv_free(c);
	capture_reset(&CAP);
}

static void test_other_clocks(void)
{
	/* CLOCK_MONOTONIC now = 1000 s; window [now - 600 s, now + 60 s]. */
	const uint64_t mono = 1000000000000ull, real = 1700000000000000000ull, tsc = 2500000000000ull;
	capture_reset(&CAP);
	S.len = 0;
	struct slowrank_conv *c = new_conv(&CAP);
	slowrank_conv_set_window(c, mono - 600000000000ull, mono + 60000000000ull);
	struct slowrank_clocks k = {.mono_ns = mono, .real_ns = real, .tsc = tsc, .tsc_per_ns = 2.5};
	slowrank_conv_set_clocks(c, &k);
	add_kernel(&S, GEMM, mono - 2000000, mono - 1000000, 1);     /* ours */
	add_kernel(&S, GEMM, real - 3000000, real - 2000000, 2);     /* CUPTI's default clock */
	add_kernel(&S, GEMM, tsc - 10000000, tsc - 5000000, 3);      /* TSC ticks: 4 ms..2 ms ago */
	add_kernel(&S, GEMM, 3 * mono + 12345, 3 * mono + 22345, 4); /* an unknown clock: dropped */
	slowrank_convert_buffer(c, S.buf, S.len, synth_next, NULL);
	decode_all(&CAP, &D, 1);
	CHECK_EQ(D.n, 4); /* name + three kernels */
	const struct slowrank_kernel_record *k1 = (const void *)D.r[1].p;
	const struct slowrank_kernel_record *k2 = (const void *)D.r[2].p;
	const struct slowrank_kernel_record *k3 = (const void *)D.r[3].p;
	CHECK_EQ(k1->start_ns, mono - 2000000);
	CHECK_EQ(k2->start_ns, mono - 3000000);
	CHECK_EQ(k2->end_ns, mono - 2000000);
	CHECK_EQ(k3->start_ns, mono - 4000000);
	CHECK_EQ(k3->end_ns, mono - 2000000);
	CHECK_EQ(slowrank_conv_counter(c, SLOWRANK_STAT_CLOCK_CONVERTED), 2);
	CHECK_EQ(slowrank_conv_counter(c, SLOWRANK_STAT_FOREIGN_CLOCK), 1);
	slowrank_conv_free(c);
	capture_reset(&CAP);
}

static void test_truncated(void)
{
	capture_reset(&CAP);
	S.len = 0;
	struct slowrank_conv *c = new_conv(&CAP);
	add_kernel(&S, GEMM, 1000, 2000, 1);
	fat_memcpy *mc = synth_add(&S, CUPTI_ACTIVITY_KIND_MEMCPY);
	mc->m.start = 2000;
	mc->m.end = 3000;
	size_t cut = S.len;
	add_kernel(&S, FLASH, 3000, 4000, 2);
	/* The buffer ends in the middle of the last kernel's prefix. */
	size_t valid = cut + 60;
	size_t n = slowrank_convert_buffer(c, S.buf, valid, synth_next, NULL);
	CHECK_EQ(n, 2);
	CHECK_EQ(slowrank_conv_counter(c, SLOWRANK_STAT_BAD_RECORDS), 1);
	CHECK_EQ(CAP.n, 1);
	decode_all(&CAP, &D, 1);
	CHECK_EQ(D.n, 3); /* name, kernel, memcpy */

	/* Ends inside a memcpy record. */
	capture_reset(&CAP);
	n = slowrank_convert_buffer(c, S.buf, sizeof(fat_kernel) + 20, synth_next, NULL);
	CHECK_EQ(n, 1);
	CHECK_EQ(slowrank_conv_counter(c, SLOWRANK_STAT_BAD_RECORDS), 2);

	/* Degenerate buffers. */
	capture_reset(&CAP);
	CHECK_EQ(slowrank_convert_buffer(c, S.buf, 0, synth_next, NULL), 0);
	CHECK_EQ(slowrank_convert_buffer(c, NULL, 100, synth_next, NULL), 0);
	CHECK_EQ(slowrank_convert_buffer(c, S.buf, 3, synth_next, NULL), 0);
	CHECK_EQ(CAP.n, 0);
	slowrank_conv_free(c);
	capture_reset(&CAP);
}

static void test_long_name(void)
{
	capture_reset(&CAP);
	S.len = 0;
	struct slowrank_conv *c = new_conv(&CAP);
	static char longname[3001];
	memset(longname, 'x', 3000);
	memcpy(longname + 2990, "_nvjet_tst", 10); /* class decided on the full name */
	longname[3000] = 0;
	add_kernel(&S, longname, 1000, 2000, 1);
	slowrank_convert_buffer(c, S.buf, S.len, synth_next, NULL);
	CHECK_EQ(CAP.n, 1);
	decode_all(&CAP, &D, 1);
	CHECK_EQ(D.n, 2);
	const struct slowrank_name_record *r = (const void *)D.r[0].p;
	CHECK_EQ(D.r[0].kind, SLOWRANK_REC_NAME);
	CHECK_EQ(r->len, SLOWRANK_NAME_MAX);
	CHECK_EQ(r->full_len, 3000);
	CHECK_EQ(r->flags, SLOWRANK_NAME_F_TRUNCATED);
	CHECK_EQ(r->size, (sizeof(*r) + SLOWRANK_NAME_MAX + 7) / 8 * 8);
	CHECK_EQ(r->kclass, SLOWRANK_CLASS_GEMM);
	const struct slowrank_kernel_record *k = (const void *)D.r[1].p;
	CHECK_EQ(k->kclass, SLOWRANK_CLASS_GEMM);
	CHECK_EQ(k->name_id, r->name_id);
	uint32_t first_id = r->name_id;

	/* A name that differs only after the bound is a different name. */
	static char longname2[3001];
	memcpy(longname2, longname, sizeof(longname));
	longname2[2000] = 'y';
	capture_reset(&CAP);
	S.len = 0;
	add_kernel(&S, longname2, 3000, 4000, 2);
	slowrank_convert_buffer(c, S.buf, S.len, synth_next, NULL);
	decode_all(&CAP, &D, 2);
	CHECK_EQ(D.n, 2);
	const struct slowrank_name_record *r2 = (const void *)D.r[0].p;
	CHECK_EQ(D.r[0].kind, SLOWRANK_REC_NAME);
	CHECK(r2->name_id != first_id);
	save_batches(&CAP, "longname");

	/* A NULL name: name_id 0, class other, no definition. */
	capture_reset(&CAP);
	S.len = 0;
	add_kernel(&S, NULL, 5000, 6000, 3);
	slowrank_convert_buffer(c, S.buf, S.len, synth_next, NULL);
	decode_all(&CAP, &D, 3);
	CHECK_EQ(D.n, 1);
	k = (const void *)D.r[0].p;
	CHECK_EQ(k->name_id, 0);
	CHECK_EQ(k->kclass, SLOWRANK_CLASS_OTHER);
	slowrank_conv_free(c);
	capture_reset(&CAP);
}

static void test_many_records(void)
{
	capture_reset(&CAP);
	S.len = 0;
	struct slowrank_conv *c = new_conv(&CAP);
	enum { NNAMES = 300, NKERNELS = 3000 };
	static char names[NNAMES][64];
	for (int i = 0; i < NNAMES; i++)
		snprintf(names[i], sizeof(names[i]), "%s_kernel_variant_%03d", (i % 3) ? "gemm" : "misc", i);
	for (int i = 0; i < NKERNELS; i++)
		add_kernel(&S, names[(i * 7) % NNAMES], 1000 + 10 * (uint64_t)i, 1005 + 10 * (uint64_t)i, (uint32_t)i);
	size_t n = slowrank_convert_buffer(c, S.buf, S.len, synth_next, NULL);
	CHECK_EQ(n, NKERNELS);
	CHECK(CAP.n > 10);
	decode_all(&CAP, &D, 1);
	static uint8_t defined[NNAMES + 1];
	memset(defined, 0, sizeof(defined));
	int kernels = 0, defs = 0;
	uint32_t last_corr = 0;
	for (int i = 0; i < D.n; i++) {
		if (D.r[i].kind == SLOWRANK_REC_NAME) {
			const struct slowrank_name_record *r = (const void *)D.r[i].p;
			CHECK(r->name_id >= 1 && r->name_id <= NNAMES);
			CHECK(!defined[r->name_id]);
			defined[r->name_id] = 1;
			defs++;
		} else if (D.r[i].kind == SLOWRANK_REC_KERNEL) {
			const struct slowrank_kernel_record *k = (const void *)D.r[i].p;
			CHECK(k->name_id >= 1 && k->name_id <= NNAMES && defined[k->name_id]);
			if (kernels > 0)
				CHECK_EQ(k->correlation, last_corr + 1);
			last_corr = k->correlation;
			kernels++;
		}
	}
	CHECK_EQ(kernels, NKERNELS);
	CHECK_EQ(defs, NNAMES);
	/* Each name definition sits in the same batch as its first use. */
	for (int i = 0; i < D.n; i++) {
		if (D.r[i].kind != SLOWRANK_REC_NAME)
			continue;
		CHECK(i + 1 < D.n && D.r[i + 1].kind == SLOWRANK_REC_KERNEL && D.r[i + 1].batch == D.r[i].batch);
	}
	/* Batches are filled: all but the last are close to the bound. */
	for (int b = 0; b + 1 < CAP.n; b++)
		CHECK(CAP.len[b] > SLOWRANK_BATCH_MAX - 600);
	CHECK_EQ(slowrank_conv_counter(c, SLOWRANK_STAT_BATCHES), CAP.n);
	CHECK_EQ(slowrank_conv_records_emitted(c), NKERNELS + NNAMES);
	save_batches(&CAP, "many");
	slowrank_conv_free(c);
	capture_reset(&CAP);
}

static void test_name_overflow(void)
{
	capture_reset(&CAP);
	struct slowrank_conv *c = new_conv(&CAP);
	static char names[SLOWRANK_MAX_NAMES + 5][24];
	int total = SLOWRANK_MAX_NAMES + 5;
	int done = 0;
	while (done < total) {
		S.len = 0;
		int chunk = total - done < 4000 ? total - done : 4000;
		for (int i = 0; i < chunk; i++) {
			snprintf(names[done + i], sizeof(names[0]), "k%06d", done + i);
			add_kernel(&S, names[done + i], 1000, 2000, (uint32_t)(done + i));
		}
		slowrank_convert_buffer(c, S.buf, S.len, synth_next, NULL);
		done += chunk;
	}
	CHECK_EQ(slowrank_conv_counter(c, SLOWRANK_STAT_NAMES), SLOWRANK_MAX_NAMES);
	CHECK_EQ(slowrank_conv_counter(c, SLOWRANK_STAT_NAMES_OVERFLOW), 5);
	CHECK_EQ(slowrank_conv_counter(c, SLOWRANK_STAT_KERNELS), total);
	/* The last kernels carry name_id 0. */
	const uint8_t *last = CAP.data[CAP.n - 1];
	const struct slowrank_batch_header *h = (const void *)last;
	const struct slowrank_kernel_record *k =
		(const void *)(last + h->total_len - sizeof(struct slowrank_kernel_record));
	CHECK_EQ(k->kind, SLOWRANK_REC_KERNEL);
	CHECK_EQ(k->name_id, 0);
	slowrank_conv_free(c);
	capture_reset(&CAP);
}

static void test_stats_and_transitions(void)
{
	capture_reset(&CAP);
	struct slowrank_conv *c = new_conv(&CAP);
	slowrank_conv_add_cupti_dropped(c, 17);
	slowrank_conv_set_counter(c, SLOWRANK_STAT_BUFFERS_REFUSED, 3);
	slowrank_conv_transition(c, 1, SLOWRANK_REASON_ESCALATION, SLOWRANK_DUTY_TIME, 123456789);
	slowrank_conv_stats(c, 0);
	slowrank_conv_transition(c, 0, SLOWRANK_REASON_EXIT, SLOWRANK_DUTY_TIME, 223456789);
	slowrank_conv_stats(c, 1);
	CHECK_EQ(CAP.n, 4);
	decode_all(&CAP, &D, 1);
	CHECK_EQ(D.n, 4);
	const struct slowrank_transition_record *t = (const void *)D.r[0].p;
	CHECK_EQ(t->kind, SLOWRANK_REC_TRANSITION);
	CHECK_EQ(t->on, 1);
	CHECK_EQ(t->reason, SLOWRANK_REASON_ESCALATION);
	CHECK_EQ(t->mode, SLOWRANK_DUTY_TIME);
	CHECK_EQ(t->timestamp, 123456789);
	const struct slowrank_stats_record *s = (const void *)D.r[1].p;
	CHECK_EQ(s->kind, SLOWRANK_REC_STATS);
	CHECK_EQ(s->n, SLOWRANK_STAT_COUNT);
	CHECK_EQ(s->size, 8 + 8 * SLOWRANK_STAT_COUNT);
	uint64_t v[SLOWRANK_STAT_COUNT];
	memcpy(v, (const uint8_t *)s + sizeof(*s), sizeof(v));
	CHECK_EQ(v[SLOWRANK_STAT_BUFFERS_REFUSED], 3);
	CHECK_EQ(v[SLOWRANK_STAT_BATCHES], 2); /* includes its own batch */
	CHECK_EQ(hdr(&CAP, 1)->cupti_dropped, 17);
	CHECK_EQ(hdr(&CAP, 1)->flags & SLOWRANK_BATCH_F_FINAL, 0);
	CHECK(hdr(&CAP, 3)->flags & SLOWRANK_BATCH_F_FINAL);
	CHECK(hdr(&CAP, 0)->flags & SLOWRANK_BATCH_F_EPOCH_START);
	CHECK_EQ(hdr(&CAP, 1)->flags & SLOWRANK_BATCH_F_EPOCH_START, 0);
	save_batches(&CAP, "stats");
	slowrank_conv_free(c);
	capture_reset(&CAP);
}

static void test_classify(void)
{
	static const struct {
		const char *name;
		int cls;
	} cases[] = {
		{"ncclKernel_AllReduce_RING_LL_Sum_float", SLOWRANK_CLASS_COMMUNICATION},
		{"_Z29ncclDevKernel_AllGather_RING_LLP24ncclDevKernelArgsStorageILm4096EE",
		 SLOWRANK_CLASS_COMMUNICATION},
		{"ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", SLOWRANK_CLASS_COMMUNICATION},
		{"void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>(...)", SLOWRANK_CLASS_COMMUNICATION},
		{"flash_fwd_splitkv_kernel", SLOWRANK_CLASS_ATTENTION},
		{"fmha_cutlassF_bf16_aligned_64x64_rf_sm80", SLOWRANK_CLASS_ATTENTION},
		{"cudnn_generated_fort_native_sdpa_sm90_knob_7_64x128x128_4x1x1_kernel0_0", SLOWRANK_CLASS_ATTENTION},
		{"void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<...>", SLOWRANK_CLASS_ATTENTION},
		{"mem_efficient_attention_forward", SLOWRANK_CLASS_ATTENTION},
		{"sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", SLOWRANK_CLASS_GEMM},
		{"nvjet_tst_128x256_64x4_2x1_v_bz_coopA_TNT", SLOWRANK_CLASS_GEMM},
		{"void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>(...)",
		 SLOWRANK_CLASS_GEMM},
		{"ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_32x5_tn", SLOWRANK_CLASS_GEMM},
		{"void cublasLt::splitKreduce_kernel<32, 16, int, float>(...)", SLOWRANK_CLASS_GEMM},
		{"void gemv2T_kernel_val<int, int, float, float, float, float, 128, 16, 4, 4, false>(...)",
		 SLOWRANK_CLASS_GEMM},
		{"void grouped_gemm_kernel<...>", SLOWRANK_CLASS_MOE},
		{"fused_moe_kernel", SLOWRANK_CLASS_MOE},
		{"moe_align_block_size_kernel", SLOWRANK_CLASS_MOE},
		{"void deep_ep::internode::dispatch<...> all_to_all", SLOWRANK_CLASS_MOE},
		{"permute_tokens_kernel", SLOWRANK_CLASS_MOE},
		{"void at::native::_grouped_mm_kernel<...>", SLOWRANK_CLASS_MOE},
		{"void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda>",
		 SLOWRANK_CLASS_COPY},
		{"void at::native::elementwise_kernel<128, 2, ...>", SLOWRANK_CLASS_OTHER},
		{"void at::native::reduce_kernel<512, 1, ...>", SLOWRANK_CLASS_OTHER},
		{"", SLOWRANK_CLASS_OTHER},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		int got = slowrank_classify(cases[i].name, strlen(cases[i].name));
		if (got != cases[i].cls)
			fprintf(stderr, "classify(%s) = %d, want %d\n", cases[i].name, got, cases[i].cls);
		CHECK_EQ(got, cases[i].cls);
	}
	CHECK_EQ(slowrank_classify(NULL, 0), SLOWRANK_CLASS_OTHER);
}

int main(int argc, char **argv)
{
	if (argc > 1)
		outdir = argv[1];
	struct {
		const char *name;
		void (*fn)(void);
	} tests[] = {
		{"basic", test_basic},
		{"clock_offset", test_clock_offset},
		{"other_clocks", test_other_clocks},
		{"truncated", test_truncated},
		{"long_name", test_long_name},
		{"many_records", test_many_records},
		{"name_overflow", test_name_overflow},
		{"stats_and_transitions", test_stats_and_transitions},
		{"classify", test_classify},
	};
	int passed = 0, failed = 0;
	for (size_t i = 0; i < sizeof(tests) / sizeof(tests[0]); i++) {
		int before = failures;
		tests[i].fn();
		if (failures == before) {
			passed++;
			printf("ok   %s\n", tests[i].name);
		} else {
			failed++;
			printf("FAIL %s\n", tests[i].name);
		}
	}
	if (batches_out)
		fclose(batches_out);
	printf("test_convert: %d checks, %d seeds written\n", checks, seeds_written);
	printf("%d passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}
