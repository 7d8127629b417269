//go:build ignore

/*
 * foreignprof.c - libnccl-profiler-foreign.so, somebody else's NCCL
 * profiler plugin (as Kineto's or NCCL's inspector would be): it binds the
 * profiler slot, asks for collectives and counts what NCCL sends it. With
 * it named in NCCL_PROFILER_PLUGIN, slowrank's library is never loaded as
 * the plugin, and the agent must stay on its libnccl uprobes (the fallback
 * tests of test/integration).
 *
 * Its event descriptors are read through the fields every version shares
 * (type at 0, parentObj at 8): nothing past them, so one handle function
 * serves v5 and v4.
 */
#include <stdint.h>

#define FOREIGN_API __attribute__((visibility("default")))

enum { ncclProfileColl = 1 << 1, ncclProfileKernelCh = 1 << 6 };

static uint64_t events; /* what NCCL sent; a real tool would export it */
static char handle;     /* one constant non-null handle: nothing is recorded */

typedef void (*logger_t)(int, unsigned long, const char *, int, const char *, ...);

static int init_v5(void **ctx, uint64_t comm_id, int *mask, const char *name, int nnodes, int nranks, int rank,
                   logger_t log) {
  (void)comm_id, (void)name, (void)nnodes, (void)nranks, (void)rank, (void)log;
  *ctx = &handle;
  *mask = ncclProfileColl | ncclProfileKernelCh;
  return 0;
}

static int init_v4(void **ctx, int *mask, const char *name, uint64_t hash, int nnodes, int nranks, int rank,
                   logger_t log) {
  return init_v5(ctx, hash, mask, name, nnodes, nranks, rank, log);
}

static int start_event(void *ctx, void **h, void *descr) {
  (void)ctx, (void)descr;
  __atomic_fetch_add(&events, 1, __ATOMIC_RELAXED);
  *h = &handle;
  return 0;
}

static int stop_event(void *h) {
  (void)h;
  return 0;
}

static int record_state(void *h, int state, void *args) {
  (void)h, (void)state, (void)args;
  return 0;
}

static int finalize(void *ctx) {
  (void)ctx;
  return 0;
}

struct foreign_v5 {
  const char *name;
  int (*init)(void **, uint64_t, int *, const char *, int, int, int, logger_t);
  int (*startEvent)(void *, void **, void *);
  int (*stopEvent)(void *);
  int (*recordEventState)(void *, int, void *);
  int (*finalize)(void *);
};

struct foreign_v4 {
  const char *name;
  int (*init)(void **, int *, const char *, uint64_t, int, int, int, logger_t);
  int (*startEvent)(void *, void **, void *);
  int (*stopEvent)(void *);
  int (*recordEventState)(void *, int, void *);
  int (*finalize)(void *);
};

FOREIGN_API struct foreign_v5 ncclProfiler_v5 = {"foreign", init_v5, start_event, stop_event, record_state, finalize};
FOREIGN_API struct foreign_v4 ncclProfiler_v4 = {"foreign", init_v4, start_event, stop_event, record_state, finalize};
