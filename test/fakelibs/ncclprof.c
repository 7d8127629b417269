/*
 * ncclprof.c - a fake NCCL's profiler-plugin host, see ncclprof.h.
 *
 * The descriptor layouts below are written here again on purpose, from
 * NVIDIA/nccl's profiler_v5.h / profiler_v4.h (NCCL 2.28 / 2.27) including
 * the fields slowrank's own header (cupti/nccl_profiler.h) leaves out
 * (coll.parentGroup): the plugin is tested against NCCL's layout, not
 * against its own reading of it.
 *
 * What NCCL does and this fake copies (src/plugin/profiler.cc, enqueue.cc):
 *   - loading, at a comm's init: NCCL_PROFILER_PLUGIN = none | a path or
 *     file name | a name X (libnccl-profiler-X.so); unset:
 *     libnccl-profiler.so; dlopen with RTLD_NOW | RTLD_LOCAL; dlsym newest
 *     first;
 *   - init per comm with a pointer to one process-wide int mask; an init
 *     error leaves that comm without profiler;
 *   - the mask is read once per operation (at the API call) and decides
 *     which events that operation emits; a level brings the levels above;
 *   - per calling thread (NCCL's thread-local ncclProfilerApiState): the
 *     outermost group's GroupApi start + GroupStartApiStop state at its
 *     first operation (whose comm's context it takes), CollApi start/stop
 *     around each enqueue, inside the user's call; at the outermost group
 *     end GroupEndApiStart state, then per comm (one plan each) Group
 *     start, Coll start (seqNumber = comm->seqNumber[func], incremented
 *     always), Coll stop ("enqueued"), Group stop; GroupApi stop; a call
 *     outside any group is its own implicit group;
 *   - KernelCh from the proxy thread afterwards: start (parent = the Coll
 *     handle, pTimer = GPU start), KernelChStop state (pTimer = GPU stop),
 *     stop; one per channel;
 *   - finalize per comm at destroy; the plugin is dlclosed after the last.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "ncclprof.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>

/* ---- NCCL's types, as upstream declares them ---- */

enum {
  ncclProfileGroup = 1 << 0,
  ncclProfileColl = 1 << 1,
  ncclProfileP2p = 1 << 2,
  ncclProfileProxyOp = 1 << 3,
  ncclProfileProxyStep = 1 << 4,
  ncclProfileKernelCh = 1 << 6,
  ncclProfileNetPlugin = 1 << 7,
  ncclProfileGroupApi = 1 << 8,
  ncclProfileCollApi = 1 << 9,
  ncclProfileP2pApi = 1 << 10,
  ncclProfileKernelLaunch = 1 << 11,
};
enum { ncclProfilerKernelChStop = 22, ncclProfilerGroupStartApiStop = 23, ncclProfilerGroupEndApiStart = 24 };

typedef struct {
  uint64_t type;
  void *parentObj;
  int rank;
  union {
    struct {
      bool graphCaptured;
      int groupDepth;
    } groupApi;
    struct {
      const char *func;
      size_t count;
      const char *datatype;
      int root;
      void *stream;
      bool graphCaptured;
    } collApi;
    struct {
      const char *func;
      size_t count;
      const char *datatype;
      void *stream;
      bool graphCaptured;
    } p2pApi;
    struct {
      void *stream;
    } kernelLaunch;
    struct {
      uint64_t seqNumber;
      const char *func;
      void const *sendBuff;
      void *recvBuff;
      size_t count;
      int root;
      const char *datatype;
      uint8_t nChannels;
      uint8_t nWarps;
      const char *algo;
      const char *proto;
      void *parentGroup;
    } coll;
    struct {
      const char *func;
      void *buff;
      const char *datatype;
      size_t count;
      int peer;
      uint8_t nChannels;
      void *parentGroup;
    } p2p;
    struct {
      pid_t pid;
      uint8_t channelId;
      int peer;
      int nSteps;
      int chunkSize;
      int isSend;
    } proxyOp;
    struct {
      int step;
    } proxyStep;
    struct {
      uint8_t channelId;
      uint64_t pTimer;
    } kernelCh;
    struct {
      int64_t id;
      void *data;
    } netPlugin;
  };
} descr_v5_t;

typedef struct {
  uint8_t type;
  void *parentObj;
  int rank;
  union {
    struct {
      uint64_t seqNumber;
      const char *func;
      void const *sendBuff;
      void *recvBuff;
      size_t count;
      int root;
      const char *datatype;
      uint8_t nChannels;
      uint8_t nWarps;
      const char *algo;
      const char *proto;
    } coll;
    struct {
      const char *func;
      void *buff;
      const char *datatype;
      size_t count;
      int peer;
      uint8_t nChannels;
    } p2p;
    struct {
      pid_t pid;
      uint8_t channelId;
      int peer;
      int nSteps;
      int chunkSize;
      int isSend;
    } proxyOp;
    struct {
      int step;
    } proxyStep;
    struct {
      uint8_t channelId;
      uint64_t pTimer;
    } kernelCh;
    struct {
      int64_t id;
      void *data;
    } netPlugin;
  };
} descr_v4_t;

typedef union {
  struct {
    size_t transSize;
  } proxyStep;
  struct {
    int appendedProxyOps;
  } proxyCtrl;
  struct {
    void *data;
  } netPlugin;
  struct {
    uint64_t pTimer;
  } kernelCh;
} state_args_t;

typedef void (*logger_t)(int, unsigned long, const char *, int, const char *, ...);

typedef struct {
  const char *name;
  int (*init)(void **context, uint64_t commId, int *mask, const char *commName, int nNodes, int nranks, int rank,
              logger_t logfn);
  int (*startEvent)(void *context, void **eHandle, descr_v5_t *eDescr);
  int (*stopEvent)(void *eHandle);
  int (*recordEventState)(void *eHandle, int eState, state_args_t *eStateArgs);
  int (*finalize)(void *context);
} profiler_v5_t;

typedef struct {
  const char *name;
  int (*init)(void **context, int *mask, const char *commName, uint64_t commHash, int nNodes, int nranks, int rank,
              logger_t logfn);
  int (*startEvent)(void *context, void **eHandle, descr_v4_t *eDescr);
  int (*stopEvent)(void *eHandle);
  int (*recordEventState)(void *eHandle, int eState, state_args_t *eStateArgs);
  int (*finalize)(void *context);
} profiler_v4_t;

/* ---- the fake's state ---- */

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER; /* NCCL's profilerMutex */
static void *lib;
static int version;
static profiler_v5_t *p5;
static profiler_v4_t *p4;
static int refcount;
static int ncclProfilerEventMask; /* the plugin writes it through init's pointer, at any time */
static uint64_t n_kch_on, n_kch_off;

struct fp_comm {
  void *ctx;
  int profiled;
  uint64_t hash;
  int nranks, rank;
  uint64_t seq[16]; /* comm->seqNumber[func] */
  pthread_mutex_t mu;
};

/* The proxy thread's queue of kernel-channel work. */
struct kjob {
  struct fp_comm *comm;
  void *coll; /* the Coll event's handle */
  int nch;
  uint64_t launched; /* globaltimer at the launch: the kernel starts after it */
  struct kjob *next;
};
static pthread_mutex_t pmu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pcond = PTHREAD_COND_INITIALIZER;
static pthread_cond_t pidle = PTHREAD_COND_INITIALIZER;
static struct kjob *qhead, *qtail;
static int inflight, proxy_started;
static pthread_t proxy;

static void logger(int level, unsigned long flags, const char *file, int line, const char *fmt, ...) {
  (void)level, (void)flags, (void)file, (void)line, (void)fmt;
}

/* SLOWRANK_FAKE_NCCL_GPU_SKEW_NS: the GPU clock runs that far ahead of the
 * host's CLOCK_REALTIME (read once in fp_load, before any thread). */
static uint64_t gpu_skew_ns;

uint64_t fp_globaltimer(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec + gpu_skew_ns;
}

static int load_mask(void) { return __atomic_load_n(&ncclProfilerEventMask, __ATOMIC_RELAXED); }

int fp_mask(void) { return load_mask(); }
uint64_t fp_ops_with_kernel_ch(void) { return __atomic_load_n(&n_kch_on, __ATOMIC_RELAXED); }
uint64_t fp_ops_without_kernel_ch(void) { return __atomic_load_n(&n_kch_off, __ATOMIC_RELAXED); }
void *fp_plugin(void) { return version == 5 ? (void *)p5 : (void *)p4; }

/* NCCL's plugin lookup (src/plugin/plugin_open.cc): the value as given (a
 * path or a file name), then libnccl-profiler-<value>.so; unset,
 * libnccl-profiler.so; "none" disables. dlopen from this library, so its
 * RUNPATH ($ORIGIN) is searched as real NCCL's would be. */
static void *open_plugin(void) {
  const char *name = getenv("NCCL_PROFILER_PLUGIN");
  char buf[4096];
  if (name && strcasecmp(name, "none") == 0) return NULL;
  if (!name || !*name) return dlopen("libnccl-profiler.so", RTLD_NOW | RTLD_LOCAL);
  void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  if (h || strchr(name, '/')) return h;
  snprintf(buf, sizeof(buf), "libnccl-profiler-%s.so", name);
  return dlopen(buf, RTLD_NOW | RTLD_LOCAL);
}

static void *proxy_main(void *arg);

int fp_load(void) {
  pthread_mutex_lock(&mu);
  if (version || lib) {
    pthread_mutex_unlock(&mu);
    return version;
  }
  const char *skew = getenv("SLOWRANK_FAKE_NCCL_GPU_SKEW_NS");
  gpu_skew_ns = skew ? strtoull(skew, NULL, 10) : 0;
  lib = open_plugin();
  if (lib) {
    const char *maxs = getenv("SLOWRANK_FAKE_NCCL_PROFILER_MAX");
    int max = maxs ? atoi(maxs) : 7;
    if (max >= 5 && (p5 = dlsym(lib, "ncclProfiler_v5")))
      version = 5;
    else if (max >= 4 && (p4 = dlsym(lib, "ncclProfiler_v4")))
      version = 4;
    if (!version) {
      dlclose(lib);
      lib = NULL;
    }
  }
  if (version && !proxy_started) {
    pthread_create(&proxy, NULL, proxy_main, NULL);
    proxy_started = 1;
  }
  pthread_mutex_unlock(&mu);
  return version;
}

struct fp_comm *fp_comm_init(uint64_t hash, int nranks, int rank) {
  struct fp_comm *c = calloc(1, sizeof(*c));
  c->hash = hash;
  c->nranks = nranks;
  c->rank = rank;
  pthread_mutex_init(&c->mu, NULL);
  pthread_mutex_lock(&mu);
  int err = 1;
  if (version == 5)
    err = p5->init(&c->ctx, hash, &ncclProfilerEventMask, "fake", 1, nranks, rank, logger);
  else if (version == 4)
    err = p4->init(&c->ctx, &ncclProfilerEventMask, "fake", hash, 1, nranks, rank, logger);
  c->profiled = version && err == 0;
  if (c->profiled) refcount++;
  pthread_mutex_unlock(&mu);
  return c;
}

int fp_comm_profiled(const struct fp_comm *c) { return c->profiled; }

/* ---- event helpers: one place that knows both layouts ---- */

static void *start(struct fp_comm *c, uint64_t type, void *parent, const descr_v5_t *d5) {
  void *h = NULL;
  if (!c->profiled || !version) return NULL; /* unloaded after its last comm */
  if (version == 5) {
    descr_v5_t d = *d5;
    d.type = type;
    d.parentObj = parent;
    d.rank = c->rank;
    p5->startEvent(c->ctx, &h, &d);
  } else {
    descr_v4_t d;
    memset(&d, 0, sizeof(d));
    d.type = (uint8_t)type;
    d.parentObj = parent;
    d.rank = c->rank;
    if (type == ncclProfileColl) {
      d.coll.seqNumber = d5->coll.seqNumber;
      d.coll.func = d5->coll.func;
      d.coll.count = d5->coll.count;
      d.coll.root = d5->coll.root;
      d.coll.datatype = d5->coll.datatype;
      d.coll.nChannels = d5->coll.nChannels;
      d.coll.nWarps = d5->coll.nWarps;
      d.coll.algo = d5->coll.algo;
      d.coll.proto = d5->coll.proto;
    } else if (type == ncclProfileP2p) {
      d.p2p.func = d5->p2p.func;
      d.p2p.count = d5->p2p.count;
      d.p2p.datatype = d5->p2p.datatype;
      d.p2p.peer = d5->p2p.peer;
      d.p2p.nChannels = d5->p2p.nChannels;
    } else if (type == ncclProfileKernelCh) {
      d.kernelCh.channelId = d5->kernelCh.channelId;
      d.kernelCh.pTimer = d5->kernelCh.pTimer;
    }
    p4->startEvent(c->ctx, &h, &d);
  }
  return h;
}

static void stop(void *h) {
  if (!h || !version) return;
  if (version == 5)
    p5->stopEvent(h);
  else
    p4->stopEvent(h);
}

static void record(void *h, int state, state_args_t *a) {
  if (!h || !version) return;
  if (version == 5)
    p5->recordEventState(h, state, a);
  else
    p4->recordEventState(h, state, a);
}

static int func_id(const char *f) {
  static const char *const names[] = {"Broadcast", "Reduce",   "AllGather", "ReduceScatter",
                                      "AllReduce", "SendRecv", "Send",      "Recv"};
  for (int i = 0; i < 8; i++)
    if (strcmp(f, names[i]) == 0) return i;
  return 15;
}

static void queue_kernel(struct fp_comm *c, void *coll, int nch) {
  struct kjob *j = malloc(sizeof(*j));
  j->comm = c;
  j->coll = coll;
  j->nch = nch;
  j->launched = fp_globaltimer();
  j->next = NULL;
  pthread_mutex_lock(&pmu);
  if (qtail)
    qtail->next = j;
  else
    qhead = j;
  qtail = j;
  inflight++;
  pthread_cond_signal(&pcond);
  pthread_mutex_unlock(&pmu);
}

/* The proxy thread: "polls the GPU" and reports each channel of each
 * operation: channels start after the launch, end before it looks. */
static void *proxy_main(void *arg) {
  (void)arg;
  pthread_mutex_lock(&pmu);
  for (;;) {
    while (!qhead) pthread_cond_wait(&pcond, &pmu);
    struct kjob *j = qhead;
    qhead = j->next;
    if (!qhead) qtail = NULL;
    pthread_mutex_unlock(&pmu);
    uint64_t end = fp_globaltimer();
    for (int ch = 0; ch < j->nch; ch++) {
      descr_v5_t d;
      memset(&d, 0, sizeof(d));
      d.kernelCh.channelId = (uint8_t)ch;
      uint64_t s0 = j->launched + 1000 + (uint64_t)ch * 10;
      uint64_t e0 = end - (uint64_t)(j->nch - 1 - ch) * 50;
      if (e0 < s0) e0 = s0;
      d.kernelCh.pTimer = s0;
      void *h = start(j->comm, ncclProfileKernelCh, j->coll, &d);
      state_args_t a;
      memset(&a, 0, sizeof(a));
      a.kernelCh.pTimer = e0;
      record(h, ncclProfilerKernelChStop, &a);
      stop(h);
    }
    free(j);
    pthread_mutex_lock(&pmu);
    if (--inflight == 0) pthread_cond_broadcast(&pidle);
  }
  return NULL;
}

void fp_proxy_drain(void) {
  pthread_mutex_lock(&pmu);
  while (inflight > 0) pthread_cond_wait(&pidle, &pmu);
  pthread_mutex_unlock(&pmu);
}

/* ---- operations ---- */

/* One operation between the API call that made it and its group end. */
struct pending {
  struct fp_comm *comm;
  const char *func;
  size_t count;
  const char *dtype;
  int root; /* or the peer of a p2p */
  int nch;
  int p2p;
  int mask;  /* read at the API call: NCCL's task->eActivationMask */
  void *api; /* the CollApi/P2pApi handle (v5): the Coll's parent */
};

/* The calling thread's API state, NCCL's thread-local ncclGroupDepth and
 * ncclProfilerApiState: the outermost group's GroupApi event (started at
 * its first operation, which names the comm whose context it takes) and
 * the operations waiting for the group end. */
static _Thread_local struct {
  int depth;
  void *gapi;
  int gapi_recorded; /* GroupStartApiStop recorded */
  struct pending *ops;
  int nops, cap;
} T;

static void group_end(struct fp_comm *c, struct pending *ops, int n) {
  /* The plan's mask: its first operation's that has one (NCCL's
   * ncclProfilerStartGroupEvent). */
  int mask = 0;
  for (int i = 0; i < n && !mask; i++) mask = ops[i].mask;
  void *group = NULL;
  if (mask & (ncclProfileGroup | ncclProfileColl | ncclProfileP2p | ncclProfileProxyOp | ncclProfileProxyStep |
              ncclProfileKernelCh | ncclProfileNetPlugin)) {
    descr_v5_t d;
    memset(&d, 0, sizeof(d));
    group = start(c, ncclProfileGroup, NULL, &d);
  }
  void *stack_handles[16] = {0};
  void **handles = n <= 16 ? stack_handles : calloc((size_t)n, sizeof(void *));
  for (int i = 0; i < n; i++) {
    void *h = NULL;
    descr_v5_t d;
    memset(&d, 0, sizeof(d));
    /* v5: the parent is the CollApi event; v4: the Group. */
    void *parent = version == 5 ? ops[i].api : group;
    int m = ops[i].mask;
    if (ops[i].p2p) {
      if (m & (ncclProfileP2p | ncclProfileProxyOp | ncclProfileProxyStep | ncclProfileKernelCh)) {
        d.p2p.func = ops[i].func;
        d.p2p.count = ops[i].count;
        d.p2p.datatype = ops[i].dtype;
        d.p2p.peer = ops[i].root;
        d.p2p.nChannels = (uint8_t)ops[i].nch;
        d.p2p.parentGroup = group;
        h = start(c, ncclProfileP2p, parent, &d);
      }
    } else {
      int f = func_id(ops[i].func);
      pthread_mutex_lock(&c->mu);
      uint64_t seq = c->seq[f]++; /* advanced whether or not the plugin is active */
      pthread_mutex_unlock(&c->mu);
      if (m &
          (ncclProfileColl | ncclProfileProxyOp | ncclProfileProxyStep | ncclProfileKernelCh | ncclProfileNetPlugin)) {
        d.coll.seqNumber = seq;
        d.coll.func = ops[i].func;
        d.coll.count = ops[i].count;
        d.coll.root = ops[i].root;
        d.coll.datatype = ops[i].dtype;
        d.coll.nChannels = (uint8_t)ops[i].nch;
        d.coll.nWarps = 16;
        d.coll.algo = "RING";
        d.coll.proto = "Simple";
        d.coll.parentGroup = group;
        h = start(c, ncclProfileColl, parent, &d);
      }
    }
    if (handles)
      handles[i] = h;
    else
      stop(h); /* no memory for the batch: stopped at once, no kernel channels */
  }
  /* Launched: the Coll/P2p events stop ("enqueued"), the kernels run later. */
  for (int i = 0; handles && i < n; i++) {
    stop(handles[i]);
    if (handles[i] && (ops[i].mask & ncclProfileKernelCh)) queue_kernel(c, handles[i], ops[i].nch);
  }
  if (handles != stack_handles) free(handles);
  stop(group);
}

void fp_group_start(void) { T.depth++; }

/* The API call of one operation (ncclEnqueueCheck): an implicit group
 * around it when the caller opened none. */
static void api_call(struct fp_comm *c, const char *func, size_t count, const char *dtype, int root, int nch, int p2p) {
  if (!c->profiled) {
    /* No plugin for this comm: only the sequence number NCCL keeps anyway. */
    if (!p2p) {
      pthread_mutex_lock(&c->mu);
      c->seq[func_id(func)]++;
      pthread_mutex_unlock(&c->mu);
    }
    return;
  }
  if (T.nops == T.cap) {
    int cap = T.cap ? 2 * T.cap : 16;
    struct pending *n = realloc(T.ops, sizeof(*n) * (size_t)cap);
    if (!n) return; /* the fake's own failure: this op is not profiled */
    T.ops = n;
    T.cap = cap;
  }
  int implicit = T.depth == 0;
  if (implicit) T.depth++;
  int mask = load_mask(); /* once per operation */
  if (mask & ncclProfileKernelCh)
    __atomic_fetch_add(&n_kch_on, 1, __ATOMIC_RELAXED);
  else
    __atomic_fetch_add(&n_kch_off, 1, __ATOMIC_RELAXED);
  if (version == 5 && !T.gapi &&
      (mask & (ncclProfileGroupApi | ncclProfileCollApi | ncclProfileP2pApi | ncclProfileColl | ncclProfileP2p |
               ncclProfileKernelCh))) {
    descr_v5_t d;
    memset(&d, 0, sizeof(d));
    d.groupApi.groupDepth = T.depth;
    T.gapi = start(c, ncclProfileGroupApi, NULL, &d);
    T.gapi_recorded = 0;
  }
  if (T.gapi && !T.gapi_recorded) {
    record(T.gapi, ncclProfilerGroupStartApiStop, NULL);
    T.gapi_recorded = 1;
  }
  struct pending *op = &T.ops[T.nops++];
  *op = (struct pending){c, func, count, dtype, root, nch, p2p, mask, NULL};
  if (version == 5) {
    descr_v5_t d;
    memset(&d, 0, sizeof(d));
    if (p2p) {
      if (mask & (ncclProfileP2pApi | ncclProfileP2p | ncclProfileKernelCh)) {
        d.p2pApi.func = func;
        d.p2pApi.count = count;
        d.p2pApi.datatype = dtype;
        op->api = start(c, ncclProfileP2pApi, T.gapi, &d);
      }
    } else if (mask & (ncclProfileCollApi | ncclProfileColl | ncclProfileKernelCh)) {
      d.collApi.func = func;
      d.collApi.count = count;
      d.collApi.datatype = dtype;
      d.collApi.root = root;
      op->api = start(c, ncclProfileCollApi, T.gapi, &d);
    }
    stop(op->api); /* the API event ends at the enqueue; the handle stays the Coll's parent */
  }
  if (implicit) fp_group_end();
}

void fp_api_coll(struct fp_comm *c, const char *func, size_t count, const char *dtype, int root, int nch) {
  api_call(c, func, count, dtype, root, nch, 0);
}

void fp_api_p2p(struct fp_comm *c, const char *func, size_t count, const char *dtype, int peer, int nch) {
  api_call(c, func, count, dtype, peer, nch, 1);
}

void fp_group_end(void) {
  if (T.depth <= 0 || --T.depth > 0) return;
  record(T.gapi, ncclProfilerGroupEndApiStart, NULL);
  /* One plan per communicator, in the order of their first operation. */
  for (int i = 0; i < T.nops; i++) {
    struct fp_comm *c = T.ops[i].comm;
    if (!c) continue; /* taken with an earlier comm's plan */
    int n = 0;
    struct pending stack[16];
    struct pending *plan = T.nops - i <= 16 ? stack : malloc(sizeof(*plan) * (size_t)(T.nops - i));
    for (int j = i; plan && j < T.nops; j++)
      if (T.ops[j].comm == c) {
        plan[n++] = T.ops[j];
        T.ops[j].comm = NULL;
      }
    if (plan) group_end(c, plan, n);
    if (plan != stack) free(plan);
  }
  T.nops = 0;
  stop(T.gapi);
  T.gapi = NULL;
}

void fp_coll(struct fp_comm *c, const char *func, size_t count, const char *dtype, int root, int nch) {
  fp_api_coll(c, func, count, dtype, root, nch);
}

void fp_group(struct fp_comm *c, int n, const char *const *funcs, const size_t *counts, const char *dtype, int nch) {
  fp_group_start();
  for (int i = 0; i < n; i++) fp_api_coll(c, funcs[i], counts[i], dtype, -1, nch);
  fp_group_end();
}

void fp_p2p(struct fp_comm *c, const char *func, size_t count, const char *dtype, int peer, int nch) {
  fp_api_p2p(c, func, count, dtype, peer, nch);
}

void fp_comm_destroy(struct fp_comm *c) {
  fp_proxy_drain();
  pthread_mutex_lock(&mu);
  if (c->profiled) {
    if (version == 5)
      p5->finalize(c->ctx);
    else
      p4->finalize(c->ctx);
    if (--refcount == 0 && lib) {
      /* NCCL dlcloses the plugin after its last comm. */
      dlclose(lib);
      lib = NULL;
      version = 0;
      p5 = NULL;
      p4 = NULL;
    }
  }
  pthread_mutex_unlock(&mu);
  pthread_mutex_destroy(&c->mu);
  free(c);
}
