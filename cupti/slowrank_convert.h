//go:build ignore

/*
 * slowrank_convert.h - CUPTI activity records -> slowrank batches.
 *
 * Pure conversion: no CUPTI runtime call, no thread, no clock. The runtime
 * (slowrank_cupti.c) passes cuptiActivityGetNextRecord as the record walker;
 * tests pass a walker over synthetic buffers built from the real CUPTI
 * header structs. Not thread-safe: the caller serialises every call on one
 * converter (the runtime holds one mutex around it).
 */
#ifndef SLOWRANK_CONVERT_H
#define SLOWRANK_CONVERT_H

#include <stddef.h>
#include <stdint.h>

#include <cupti.h>

#include "slowrank_abi.h"

/*
 * The CUPTI record structs the converter reads. The library never relies on a
 * record's full size (CUPTI's walker knows it); it reads only the prefix that
 * has kept the same layout from CUpti_ActivityKernel4 / CUpti_ActivityMemcpy /
 * CUpti_ActivityMemset up to the newest versions (CUDA 11.8 .. 13.x), which
 * slowrank_convert.c pins with _Static_assert. Override for a header that no
 * longer ships these names, e.g. -DSLOWRANK_KERNEL_RECORD=CUpti_ActivityKernel9.
 */
#ifndef SLOWRANK_KERNEL_RECORD
#define SLOWRANK_KERNEL_RECORD CUpti_ActivityKernel4
#endif
#ifndef SLOWRANK_MEMCPY_RECORD
#define SLOWRANK_MEMCPY_RECORD CUpti_ActivityMemcpy
#endif
#ifndef SLOWRANK_MEMSET_RECORD
#define SLOWRANK_MEMSET_RECORD CUpti_ActivityMemset
#endif

/* Bounded name table (distinct kernel names per process). */
#define SLOWRANK_MAX_NAMES 16384

/* Walker results. */
#define SLOWRANK_NEXT_OK 0
#define SLOWRANK_NEXT_END 1
#define SLOWRANK_NEXT_ERROR 2

/* Same contract as cuptiActivityGetNextRecord: *rec == NULL asks for the first
 * record, otherwise the record after *rec. */
typedef int (*slowrank_next_fn)(void *user, uint8_t *buf, size_t valid, CUpti_Activity **rec);

/* Receives each finished batch (len <= SLOWRANK_BATCH_MAX). */
typedef void (*slowrank_emit_fn)(void *user, const void *batch, uint32_t len);

struct slowrank_conv;

struct slowrank_conv_config {
	uint32_t pid;
	slowrank_emit_fn emit;
	void *emit_user;
};

struct slowrank_conv *slowrank_conv_new(const struct slowrank_conv_config *cfg);
void slowrank_conv_free(struct slowrank_conv *c);

/* Clock of subsequent records (SLOWRANK_CLOCK_*); offset is added to every
 * CUPTI timestamp. */
void slowrank_conv_set_clock(struct slowrank_conv *c, uint16_t source, int64_t offset_ns, uint32_t bracket_ns);
/* Records whose CLOCK_MONOTONIC times fall outside [lo_ns, hi_ns] are on
 * another clock (another CUPTI client replaced the timestamp callback):
 * dropped and counted in SLOWRANK_STAT_FOREIGN_CLOCK. hi_ns 0: no check. */
void slowrank_conv_set_window(struct slowrank_conv *c, uint64_t lo_ns, uint64_t hi_ns);

/* Other clocks a record may be on when another CUPTI client replaced the
 * timestamp callback and CUPTI kept it (Kineto's TSC ticks, CUPTI's default
 * CLOCK_REALTIME), read when the buffer arrived. A record outside the
 * window but near one of them is mapped to CLOCK_MONOTONIC and counted in
 * SLOWRANK_STAT_CLOCK_CONVERTED. Zero fields: that clock is not tried. */
struct slowrank_clocks {
	uint64_t mono_ns;  /* CLOCK_MONOTONIC now */
	uint64_t real_ns;  /* CLOCK_REALTIME now */
	uint64_t tsc;      /* time-stamp counter now */
	double tsc_per_ns; /* its rate, measured against CLOCK_MONOTONIC */
};
void slowrank_conv_set_clocks(struct slowrank_conv *c, const struct slowrank_clocks *k);
/* Control generation reported in batch headers. */
void slowrank_conv_set_generation(struct slowrank_conv *c, uint32_t generation);
/* Starts a new attach epoch: every name is sent again before its next use
 * and the next batch carries SLOWRANK_BATCH_F_EPOCH_START. */
void slowrank_conv_new_epoch(struct slowrank_conv *c);

/* Walks buf[0:valid) with next() and emits batches. Returns the number of
 * records converted into batch records. Flushes the open batch at the end. */
size_t slowrank_convert_buffer(struct slowrank_conv *c, uint8_t *buf, size_t valid, slowrank_next_fn next,
			       void *next_user);

/* Appends a transition record and emits it (with anything pending). */
void slowrank_conv_transition(struct slowrank_conv *c, int on, int reason, int mode, uint64_t ts_ns);
/* Appends a stats record and emits it; final marks the batch FINAL. */
void slowrank_conv_stats(struct slowrank_conv *c, int final);
/* Appends a zeroed record of size bytes (rounded up to 8) to the open batch,
 * emitting it first when the record does not fit; the caller fills in the
 * record, header included (the NCCL plugin's records). */
void *slowrank_conv_reserve(struct slowrank_conv *c, uint32_t size);
/* Records in the open batch. */
uint32_t slowrank_conv_pending(const struct slowrank_conv *c);
/* Emits the open batch, if any. */
void slowrank_conv_flush(struct slowrank_conv *c);

/* Counters (SLOWRANK_STAT_*) kept by the converter; the runtime adds its own. */
void slowrank_conv_count(struct slowrank_conv *c, int stat, uint64_t delta);
void slowrank_conv_set_counter(struct slowrank_conv *c, int stat, uint64_t value);
uint64_t slowrank_conv_counter(const struct slowrank_conv *c, int stat);
void slowrank_conv_add_cupti_dropped(struct slowrank_conv *c, uint64_t n);
void slowrank_conv_add_lib_dropped(struct slowrank_conv *c, uint64_t n);
uint64_t slowrank_conv_cupti_dropped(const struct slowrank_conv *c);
uint64_t slowrank_conv_lib_dropped(const struct slowrank_conv *c);
uint64_t slowrank_conv_records_emitted(const struct slowrank_conv *c);

/* Classifies one kernel name (SLOWRANK_CLASS_*); exposed for tests. */
int slowrank_classify(const char *name, size_t len);

#endif /* SLOWRANK_CONVERT_H */
