/*
 * ncclprof.c - a fake NCCL's profiler-plugin host, see ncclprof.h.
 *
 * The descriptor layouts below are written here again on purpose, from
 * NVIDIA/nccl's profiler_v6.h / profiler_v5.h / profiler_v4.h (v2.29.7-1 /
 * v2.28.9-1 / v2.27.7-1; the vendored copies are third_party/nccl/)
 * including the fields slowrank never reads: the plugin is tested against
 * NCCL's layout, not against its own reading of it.
 *
 * What NCCL does and this fake copies (src/plugin/profiler.cc,
 * plugin_open.cc, enqueue.cc, group.cc, transport/profiler.cc and
 * plugin/profiler/profiler_v4.cc, profiler_v5.cc and ce_coll.cc of the tags;
 * SLOWRANK_FAKE_NCCL_PROFILER_MAX names the release: 4 = 2.27.7, 5 = 2.28.9,
 * the default, 6 = 2.29.7 / 2.30.7):
 *   - loading, at a comm's init: NCCL_PROFILER_PLUGIN = none | a path or
 *     file name | a name X (libnccl-profiler-X.so unless X is lib*.so);
 *     unset: libnccl-profiler.so; dlopen with RTLD_NOW | RTLD_LOCAL; dlsym
 *     newest first (2.29: ncclProfiler_v6, _v5, _v4; 2.28: _v5, _v4; 2.27:
 *     _v4); a failed load
 *     is never tried again; one reference per comm init, the last
 *     reference's unload dlcloses it and a later comm loads it afresh;
 *   - init per comm with a pointer to one process-wide int mask. An init
 *     error: 2.27 sets ncclProfiler = NULL for the whole process (no event,
 *     no finalize, until the unload); 2.28 carries on with the context the
 *     plugin left (events still come, with it) and skips finalize for a
 *     NULL context; 2.27 finalizes every comm whatever its context;
 *   - the mask is read once per operation (at the API call) and decides
 *     which events that operation emits; a level brings the levels above
 *     (the exact sets: M_* below);
 *   - 2.28, per calling thread (NCCL's thread-local ncclProfilerApiState):
 *     the outermost group's GroupApi start + GroupStartApiStop state at its
 *     first operation (whose comm's context it takes), CollApi/P2pApi
 *     start/stop around each task's append, inside the user's call (parent
 *     GroupApi); at the outermost group end GroupEndApiStart, the plans,
 *     GroupApi stop; a call outside any group is its own implicit group;
 *   - per comm (one plan each), hostStreamPlanTask: Group start, every Coll
 *     start (seqNumber = comm->seqNumber[func], advanced always; 2.28:
 *     parentObj = CollApi, coll.parentGroup = Group; 2.27: parentObj =
 *     Group, and no Coll/P2p at all without a Group handle), then every P2p
 *     start, the proxy work uploaded, every Coll then P2p stop
 *     ("enqueued"), Group stop;
 *   - KernelCh from the proxy thread: every channel's start (parent = the
 *     Coll handle, pTimer = GPU start), then per channel the KernelChStop
 *     state (pTimer = GPU stop) and stop;
 *   - rank only where NCCL sets it: Coll and P2p (not Group, the API
 *     events or KernelCh);
 *   - 2.28: ncclAlltoAll / ncclGather / ncclScatter become Send/Recv tasks
 *     (P2pApi + P2p per peer), as NCCL's taskAppend makes them;
 *   - 2.28-2.30: the thread's CollApi handle is never cleared: every
 *     collective append stops it again, also when it started none;
 *   - copy-engine collectives (SLOWRANK_FAKE_NCCL_CE: AllGather, AlltoAll,
 *     Gather, Scatter): 2.28 emits no event for them at all; 2.29 GroupApi
 *     and CollApi (the CE types count in their masks), then per CE task a
 *     plan of its own before the kernel plan: CeColl (parent the CollApi,
 *     seqNumber the comm's CE counter, which each synchronisation
 *     advances), CeSync / CeBatch under it, no Coll;
 *   - a plugin bound at a lower version than the release's gets what
 *     NCCL's shim passes: v5 under 2.29 no CE events and no CE bits in the
 *     mask after init; v4 under 2.28 no API events or their states,
 *     Coll/P2p parentObj = the Group, p2p.nChannels unset (0 here).
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
  ncclProfileCeColl = 1 << 12,
  ncclProfileCeSync = 1 << 13,
  ncclProfileCeBatch = 1 << 14,
};
#define M_CE (ncclProfileCeColl | ncclProfileCeSync | ncclProfileCeBatch)
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

/* v6 (NCCL 2.29, 2.30): v5's members and the copy-engine ones. */
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
    struct {
      uint64_t seqNumber;
      const char *func;
      void const *sendBuff;
      void *recvBuff;
      size_t count;
      int root;
      const char *datatype;
      const char *syncStrategy;
      bool intraBatchSync;
      uint32_t batchSize;
      uint32_t numBatches;
      uint32_t ceSeqNum;
      void *stream;
    } ceColl;
    struct {
      bool isComplete;
      int nRanks;
    } ceCollSync;
    struct {
      int numOps;
      size_t totalBytes;
      bool useIntraSync;
    } ceCollBatch;
  };
} descr_v6_t;

/* What NCCL fills (its ncclProfilerEventDescr_t, v6's from 2.29), handed to
 * the bound version by start(). */
typedef descr_v6_t descr_t;
_Static_assert(sizeof(descr_v6_t) == sizeof(descr_v5_t), "v5 and v6 descriptors differ in size");

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
  int (*init)(void **context, uint64_t commId, int *mask, const char *commName, int nNodes, int nranks, int rank,
              logger_t logfn);
  int (*startEvent)(void *context, void **eHandle, descr_v6_t *eDescr);
  int (*stopEvent)(void *eHandle);
  int (*recordEventState)(void *eHandle, int eState, state_args_t *eStateArgs);
  int (*finalize)(void *context);
} profiler_v6_t;

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

/* The NCCL release emulated, SLOWRANK_FAKE_NCCL_PROFILER_MAX: 4 = 2.27.7
 * (dlsym from ncclProfiler_v4), 5 = 2.28.9 (from _v5; the default, what
 * torch 2.11 ships). It decides which events NCCL makes and how; the
 * version bound (the newest the plugin exports, at most the release's)
 * decides the descriptor layout, NCCL's shims dropping what it lacks. */
static int release = 5;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER; /* NCCL's profilerMutex */
static void *lib;
static int version;     /* API bound, 0: none (ncclProfiler == NULL) */
static int load_failed; /* profilerPluginLoadFailed: never tried again */
static int plugin_off;  /* 2.27: an init error set ncclProfiler = NULL until the last comm */
static profiler_v6_t *p6;
static profiler_v5_t *p5;
static profiler_v4_t *p4;
static int ce_mode;               /* SLOWRANK_FAKE_NCCL_CE: AllGather/AlltoAll/Gather/Scatter on the copy engines */
static int refcount;              /* profilerPluginRefCount: one per comm init while loaded */
static int ncclProfilerEventMask; /* the plugin writes it through init's pointer, at any time */
static uint64_t n_kch_on, n_kch_off, n_stale_stops;

struct fp_comm {
  void *ctx;    /* comm->profilerContext: what the plugin's init left there */
  int profiled; /* init succeeded */
  int held;     /* counted in refcount */
  uint64_t hash;
  int nranks, rank;
  uint64_t seq[16]; /* comm->seqNumber[func] */
  uint32_t ce_seq;  /* comm->ceColl.ceSeqNum: one per CE synchronisation */
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
 * host's CLOCK_REALTIME, behind when negative (read once in fp_load, before
 * any thread). */
static uint64_t gpu_skew_ns;

uint64_t fp_globaltimer(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec + gpu_skew_ns;
}

static int load_mask(void) { return __atomic_load_n(&ncclProfilerEventMask, __ATOMIC_RELAXED); }

int fp_mask(void) { return load_mask(); }
void fp_set_mask(int mask) { __atomic_store_n(&ncclProfilerEventMask, mask, __ATOMIC_RELAXED); }
uint64_t fp_ops_with_kernel_ch(void) { return __atomic_load_n(&n_kch_on, __ATOMIC_RELAXED); }
uint64_t fp_ops_without_kernel_ch(void) { return __atomic_load_n(&n_kch_off, __ATOMIC_RELAXED); }
uint64_t fp_stale_api_stops(void) { return __atomic_load_n(&n_stale_stops, __ATOMIC_RELAXED); }
void *fp_plugin(void) { return version == 6 ? (void *)p6 : version == 5 ? (void *)p5 : (void *)p4; }

/* ncclProfiler != NULL: the plugin is loaded and no 2.27 init error
 * turned it off. */
static int active(void) {
  return __atomic_load_n(&version, __ATOMIC_ACQUIRE) != 0 && !__atomic_load_n(&plugin_off, __ATOMIC_ACQUIRE);
}

/* NCCL's plugin lookup (src/plugin/plugin_open.cc): the value as given (a
 * path or a file name), then, for a bare name not already lib*.so,
 * libnccl-profiler-<value>.so; unset, libnccl-profiler.so (then the net
 * plugin's library, which the fake has none of); "none" disables. dlopen
 * from this library, so its RUNPATH ($ORIGIN) is searched as real NCCL's
 * would be. */
static void *open_plugin(void) {
  const char *name = getenv("NCCL_PROFILER_PLUGIN");
  char buf[4096];
  if (name && strcasecmp(name, "none") == 0) return NULL;
  if (!name || !*name) return dlopen("libnccl-profiler.so", RTLD_NOW | RTLD_LOCAL);
  void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  size_t n = strlen(name);
  int libso = strncmp(name, "lib", 3) == 0 && n >= 3 && strcmp(name + n - 3, ".so") == 0;
  if (h || strchr(name, '/') || libso) return h;
  snprintf(buf, sizeof(buf), "libnccl-profiler-%s.so", name);
  return dlopen(buf, RTLD_NOW | RTLD_LOCAL);
}

static void *proxy_main(void *arg);

/* ncclProfilerPluginLoad without the refcount; mu held. */
static int load_locked(void) {
  if (version || load_failed) return version;
  const char *skew = getenv("SLOWRANK_FAKE_NCCL_GPU_SKEW_NS");
  gpu_skew_ns = skew ? (uint64_t)strtoll(skew, NULL, 10) : 0; /* behind: wraps, added modulo 2^64 */
  const char *maxs = getenv("SLOWRANK_FAKE_NCCL_PROFILER_MAX");
  release = maxs && atoi(maxs) >= 4 ? atoi(maxs) : 5;
  if (release > 6) release = 6;
  const char *ce = getenv("SLOWRANK_FAKE_NCCL_CE");
  ce_mode = ce && *ce && strcmp(ce, "0") != 0;
  lib = open_plugin();
  if (lib) {
    /* newest first: getNcclProfiler_v6 (2.29), _v5 (2.28), _v4 (v1-v3: none of slowrank's concern) */
    int v = 0;
    if (release >= 6 && (p6 = dlsym(lib, "ncclProfiler_v6")))
      v = 6;
    else if (release >= 5 && (p5 = dlsym(lib, "ncclProfiler_v5")))
      v = 5;
    else if ((p4 = dlsym(lib, "ncclProfiler_v4")))
      v = 4;
    __atomic_store_n(&version, v, __ATOMIC_RELEASE);
    if (!version) {
      dlclose(lib);
      lib = NULL;
    }
  }
  if (!version) load_failed = 1;
  if (version && !proxy_started) {
    pthread_create(&proxy, NULL, proxy_main, NULL);
    proxy_started = 1;
  }
  return version;
}

int fp_load(void) {
  pthread_mutex_lock(&mu);
  int v = load_locked();
  pthread_mutex_unlock(&mu);
  return v;
}

/* ncclProfilerPluginInit: load (refcount + 1), then init. On an error
 * 2.27 sets ncclProfiler = NULL for the whole process; 2.28 carries on
 * with the comm's context as the plugin left it. */
struct fp_comm *fp_comm_init(uint64_t hash, int nranks, int rank) {
  struct fp_comm *c = calloc(1, sizeof(*c));
  c->hash = hash;
  c->nranks = nranks;
  c->rank = rank;
  pthread_mutex_init(&c->mu, NULL);
  pthread_mutex_lock(&mu);
  if (load_locked()) {
    refcount++;
    c->held = 1;
  }
  if (active()) {
    int err = 1;
    if (version == 6)
      err = p6->init(&c->ctx, hash, &ncclProfilerEventMask, "fake", 1, nranks, rank, logger);
    else if (version == 5)
      err = p5->init(&c->ctx, hash, &ncclProfilerEventMask, "fake", 1, nranks, rank, logger);
    else
      err = p4->init(&c->ctx, &ncclProfilerEventMask, "fake", hash, 1, nranks, rank, logger);
    /* 2.29's v5 shim: no CE bits in the mask after a v5 init */
    if (!err && version == 5 && release >= 6) __atomic_fetch_and(&ncclProfilerEventMask, ~M_CE, __ATOMIC_RELAXED);
    c->profiled = err == 0;
    if (err && release == 4) __atomic_store_n(&plugin_off, 1, __ATOMIC_RELEASE);
  }
  pthread_mutex_unlock(&mu);
  return c;
}

int fp_comm_profiled(const struct fp_comm *c) { return c->profiled; }

/* ---- event helpers: one place that knows both layouts ---- */

/* Delivers one event NCCL made (descriptor d5 in the release's shape:
 * type, parentObj and rank as NCCL sets them) to the bound version, as
 * NCCL's shims do: a v4 plugin under 2.28 gets no API events, and its
 * Coll/P2p parent is the Group (v5's parentGroup). */
static void *start(struct fp_comm *c, const descr_t *d5) {
  void *h = NULL;
  if (!active()) return NULL; /* ncclProfiler == NULL */
  if (version == 6) {
    descr_v6_t d = *d5;
    p6->startEvent(c->ctx, &h, &d);
    return h;
  }
  int ce = d5->type == ncclProfileCeColl || d5->type == ncclProfileCeSync || d5->type == ncclProfileCeBatch;
  if (version == 5) {
    if (ce) return NULL; /* 2.29's v5 shim discards CE events */
    descr_v5_t d;
    memcpy(&d, d5, sizeof(d)); /* v5's members lie where v6 has them */
    p5->startEvent(c->ctx, &h, &d);
    return h;
  }
  descr_v4_t d;
  memset(&d, 0, sizeof(d));
  d.type = (uint8_t)d5->type;
  d.parentObj = d5->parentObj;
  d.rank = d5->rank;
  switch (d5->type) {
  case ncclProfileGroup:
    break;
  case ncclProfileColl:
    if (release >= 5) d.parentObj = d5->coll.parentGroup;
    d.coll.seqNumber = d5->coll.seqNumber;
    d.coll.func = d5->coll.func;
    d.coll.sendBuff = d5->coll.sendBuff;
    d.coll.recvBuff = d5->coll.recvBuff;
    d.coll.count = d5->coll.count;
    d.coll.root = d5->coll.root;
    d.coll.datatype = d5->coll.datatype;
    d.coll.nChannels = d5->coll.nChannels;
    d.coll.nWarps = d5->coll.nWarps;
    d.coll.algo = d5->coll.algo;
    d.coll.proto = d5->coll.proto;
    break;
  case ncclProfileP2p:
    if (release >= 5) d.parentObj = d5->p2p.parentGroup;
    d.p2p.func = d5->p2p.func;
    d.p2p.buff = d5->p2p.buff;
    d.p2p.count = d5->p2p.count;
    d.p2p.datatype = d5->p2p.datatype;
    d.p2p.peer = d5->p2p.peer;
    /* 2.28's v4 shim leaves p2p.nChannels unset (stack garbage there; 0
     * here); 2.27 sets it. */
    if (release == 4) d.p2p.nChannels = d5->p2p.nChannels;
    break;
  case ncclProfileKernelCh:
    d.kernelCh.channelId = d5->kernelCh.channelId;
    d.kernelCh.pTimer = d5->kernelCh.pTimer;
    break;
  default:
    return NULL; /* the shim's default: not delivered, the handle stays NULL */
  }
  p4->startEvent(c->ctx, &h, &d);
  return h;
}

static void stop(void *h) {
  if (!h || !active()) return;
  if (version == 6)
    p6->stopEvent(h);
  else if (version == 5)
    p5->stopEvent(h);
  else
    p4->stopEvent(h);
}

static void record(void *h, int state, state_args_t *a) {
  if (!h || !active()) return;
  if (version == 6)
    p6->recordEventState(h, state, a);
  else if (version == 5)
    p5->recordEventState(h, state, a);
  else if (state != ncclProfilerGroupStartApiStop && state != ncclProfilerGroupEndApiStart)
    p4->recordEventState(h, state, a); /* the v4 shim drops the group API states */
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

/* The proxy thread: "polls the GPU" for each operation as NCCL's
 * profilerProxyProgress does: every channel's start first (the KernelCh
 * event, parent the Coll/P2p, pTimer the GPU start; no rank), then each
 * channel's KernelChStop state (pTimer the GPU stop) and stop. Channels
 * start after the launch and end before it looks. */
static void *proxy_main(void *arg) {
  (void)arg;
  pthread_mutex_lock(&pmu);
  for (;;) {
    while (!qhead) pthread_cond_wait(&pcond, &pmu);
    struct kjob *j = qhead;
    qhead = j->next;
    if (!qhead) qtail = NULL;
    pthread_mutex_unlock(&pmu);
    void *hs[64] = {0};
    int nch = j->nch < 64 ? j->nch : 64;
    for (int ch = 0; ch < nch; ch++) {
      descr_t d;
      memset(&d, 0, sizeof(d));
      d.type = ncclProfileKernelCh;
      d.parentObj = j->coll;
      d.kernelCh.channelId = (uint8_t)ch;
      d.kernelCh.pTimer = j->launched + 1000 + (uint64_t)ch * 10;
      hs[ch] = start(j->comm, &d);
    }
    uint64_t end = fp_globaltimer();
    for (int ch = 0; ch < nch; ch++) {
      uint64_t s0 = j->launched + 1000 + (uint64_t)ch * 10;
      uint64_t e0 = end - (uint64_t)(nch - 1 - ch) * 50;
      if (e0 < s0) e0 = s0;
      state_args_t a;
      memset(&a, 0, sizeof(a));
      a.kernelCh.pTimer = e0;
      if (hs[ch]) {
        record(hs[ch], ncclProfilerKernelChStop, &a);
        stop(hs[ch]);
      }
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

/* The event types whose activation makes NCCL emit each event (a level
 * brings the levels above it), per src/plugin/profiler.cc of the release. */
#define M_GROUP_API                                                                                            \
  (ncclProfileGroupApi | ncclProfileP2pApi | ncclProfileCollApi | ncclProfileKernelLaunch | ncclProfileGroup | \
   ncclProfileColl | ncclProfileP2p | ncclProfileProxyOp | ncclProfileProxyStep | ncclProfileKernelCh |        \
   ncclProfileNetPlugin)
#define M_COLL_API                                                                                          \
  (ncclProfileCollApi | ncclProfileColl | ncclProfileProxyOp | ncclProfileProxyStep | ncclProfileKernelCh | \
   ncclProfileNetPlugin)
#define M_P2P_API                                                                                         \
  (ncclProfileP2pApi | ncclProfileP2p | ncclProfileProxyOp | ncclProfileProxyStep | ncclProfileKernelCh | \
   ncclProfileNetPlugin)
#define M_GROUP                                                                                      \
  (ncclProfileGroup | ncclProfileColl | ncclProfileP2p | ncclProfileProxyOp | ncclProfileProxyStep | \
   ncclProfileKernelCh | ncclProfileNetPlugin)
#define M_COLL \
  (ncclProfileColl | ncclProfileProxyOp | ncclProfileProxyStep | ncclProfileKernelCh | ncclProfileNetPlugin)
/* P2p: 2.27 leaves NetPlugin out */
#define M_P2P(rel)                                                                    \
  (ncclProfileP2p | ncclProfileProxyOp | ncclProfileProxyStep | ncclProfileKernelCh | \
   ((rel) >= 5 ? ncclProfileNetPlugin : 0))

/* 2.29 adds the CE types to what starts GroupApi and CollApi. */
#define M_GROUP_API_OF(rel) (M_GROUP_API | ((rel) >= 6 ? M_CE : 0))
#define M_COLL_API_OF(rel) (M_COLL_API | ((rel) >= 6 ? M_CE : 0))

/* One operation between the API call that made it and its group end. */
struct pending {
  struct fp_comm *comm;
  const char *func;
  size_t count;
  const char *dtype;
  int root; /* or the peer of a p2p */
  int nch;
  int p2p;
  int ce;    /* on the copy engines: a plan of its own, CeColl instead of Coll (2.29) */
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
  void *coll_api;    /* ncclProfilerApiState.collApiEventHandle: never cleared by NCCL */
  int gapi_recorded; /* GroupStartApiStop recorded */
  struct pending *ops;
  int nops, cap;
} T;

/* One comm's plan at the group end: hostStreamPlanTask. Group start, every
 * Coll start then every P2p start (2.27: only under a Group handle), the
 * proxy work uploaded (kernel channels may report from now on), every
 * Coll/P2p stop ("enqueued"), Group stop. */
static void plan_launch(struct fp_comm *c, struct pending *ops, int n) {
  /* The plan's mask: its first operation's that has one (NCCL's
   * ncclProfilerStartGroupEvent). */
  int mask = 0;
  for (int i = 0; i < n && !mask; i++) mask = ops[i].mask;
  void *group = NULL;
  if (mask & M_GROUP) {
    descr_t d;
    memset(&d, 0, sizeof(d));
    d.type = ncclProfileGroup;
    group = start(c, &d);
  }
  void *stack_handles[16] = {0};
  void **handles = n <= 16 ? stack_handles : calloc((size_t)n, sizeof(void *));
  for (int pass = 0; pass < 2; pass++) {
    for (int i = 0; i < n; i++) {
      if (ops[i].p2p != pass) continue;
      void *h = NULL;
      descr_t d;
      memset(&d, 0, sizeof(d));
      d.rank = c->rank;
      /* 2.28: parentObj the CollApi/P2pApi event, parentGroup the Group;
       * 2.27: parentObj the Group. */
      d.parentObj = release >= 5 ? ops[i].api : group;
      int m = ops[i].mask;
      int under_group = release >= 5 || group != NULL;
      if (ops[i].p2p) {
        if (under_group && (m & M_P2P(release))) {
          d.type = ncclProfileP2p;
          d.p2p.func = ops[i].func;
          d.p2p.count = ops[i].count;
          d.p2p.datatype = ops[i].dtype;
          d.p2p.peer = ops[i].root;
          d.p2p.nChannels = (uint8_t)ops[i].nch;
          d.p2p.parentGroup = group;
          h = start(c, &d);
        }
      } else {
        int f = func_id(ops[i].func);
        pthread_mutex_lock(&c->mu);
        uint64_t seq = c->seq[f]++; /* advanced whether or not the plugin is active */
        pthread_mutex_unlock(&c->mu);
        if (under_group && (m & M_COLL)) {
          d.type = ncclProfileColl;
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
          h = start(c, &d);
        }
      }
      if (handles)
        handles[i] = h;
      else
        stop(h); /* no memory for the batch: stopped at once, no kernel channels */
    }
  }
  /* uploadProxyOps + ncclProxyStart: the proxy thread may run from here */
  for (int i = 0; handles && i < n; i++)
    if (handles[i] && (ops[i].mask & ncclProfileKernelCh)) queue_kernel(c, handles[i], ops[i].nch);
  for (int pass = 0; handles && pass < 2; pass++)
    for (int i = 0; i < n; i++)
      if (ops[i].p2p == pass) stop(handles[i]);
  if (handles != stack_handles) free(handles);
  stop(group);
}

/* A copy-engine collective's plan (2.29, ncclLaunchCeColl): CeColl start
 * (parent the task's CollApi, rank, seqNumber = ceSeqNum = the comm's CE
 * counter) if the mask, read now, has any CE type; a synchronisation (the
 * counter + 1; CeSync under CeColl), the batch of copies (CeBatch), a
 * synchronisation; CeColl stop. No Group, no Coll, no kernel channels, no
 * seqNumber[func]. */
static void ce_launch(struct fp_comm *c, const struct pending *op) {
  int mask = load_mask();
  void *ce = NULL;
  descr_t d;
  if (mask & M_CE) {
    memset(&d, 0, sizeof(d));
    d.type = ncclProfileCeColl;
    d.parentObj = op->api;
    d.rank = c->rank;
    d.ceColl.seqNumber = c->ce_seq;
    d.ceColl.func = op->func;
    d.ceColl.count = op->count;
    d.ceColl.root = op->root;
    d.ceColl.datatype = op->dtype;
    d.ceColl.syncStrategy = "UC";
    d.ceColl.ceSeqNum = c->ce_seq;
    ce = start(c, &d);
  }
  for (int step = 0; step < 3; step++) {
    int sync = step != 1;
    if (sync) c->ce_seq++;
    int bit = sync ? ncclProfileCeSync : ncclProfileCeBatch;
    if (!ce || !(mask & bit)) continue;
    memset(&d, 0, sizeof(d));
    d.type = (uint64_t)bit;
    d.parentObj = ce;
    d.rank = c->rank;
    if (sync) {
      d.ceCollSync.isComplete = step == 2;
      d.ceCollSync.nRanks = c->nranks;
    } else {
      d.ceCollBatch.numOps = 1;
      d.ceCollBatch.totalBytes = op->count;
    }
    stop(start(c, &d));
  }
  stop(ce);
}

/* A comm's plans at the group end: each copy-engine task first, a plan of
 * its own (2.29's planner takes the CE queue before the kernel tasks), then
 * one plan of the rest. */
static void group_end(struct fp_comm *c, struct pending *ops, int n) {
  int k = 0;
  for (int i = 0; i < n; i++) {
    if (ops[i].ce)
      ce_launch(c, &ops[i]);
    else
      ops[k++] = ops[i];
  }
  if (k) plan_launch(c, ops, k);
}

void fp_group_start(void) { T.depth++; }

/* The API call of one operation (ncclEnqueueCheck): an implicit group
 * around it when the caller opened none. */
static void task_append(struct fp_comm *c, const char *func, size_t count, const char *dtype, int root, int nch,
                        int p2p, int ce) {
  if (!active()) {
    /* No plugin: only the sequence number NCCL keeps anyway. */
    if (!p2p && !ce) {
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
  int mask = load_mask(); /* once per operation */
  if (mask & ncclProfileKernelCh)
    __atomic_fetch_add(&n_kch_on, 1, __ATOMIC_RELAXED);
  else
    __atomic_fetch_add(&n_kch_off, 1, __ATOMIC_RELAXED);
  /* 2.28: GroupApi (no parent, no rank) at the outermost group's first
   * operation, GroupStartApiStop right after it. */
  if (release >= 5 && !T.gapi && (mask & M_GROUP_API_OF(release))) {
    descr_t d;
    memset(&d, 0, sizeof(d));
    d.type = ncclProfileGroupApi;
    d.groupApi.groupDepth = T.depth;
    T.gapi = start(c, &d);
    T.gapi_recorded = 0;
  }
  if (T.gapi && !T.gapi_recorded) {
    record(T.gapi, ncclProfilerGroupStartApiStop, NULL);
    T.gapi_recorded = 1;
  }
  struct pending *op = &T.ops[T.nops++];
  *op = (struct pending){c, func, count, dtype, root, nch, p2p, ce, mask, NULL};
  if (release >= 5) {
    /* CollApi/P2pApi: parent the GroupApi event, no rank; around the
     * task's append, inside the user's call. */
    descr_t d;
    memset(&d, 0, sizeof(d));
    d.parentObj = T.gapi;
    if (p2p) {
      if (mask & M_P2P_API) {
        d.type = ncclProfileP2pApi;
        d.p2pApi.func = func;
        d.p2pApi.count = count;
        d.p2pApi.datatype = dtype;
        op->api = start(c, &d);
      }
      stop(op->api); /* the API event ends at the enqueue; the handle stays the P2p's parent */
    } else {
      if (mask & M_COLL_API_OF(release)) {
        d.type = ncclProfileCollApi;
        d.collApi.func = func;
        d.collApi.count = count;
        d.collApi.datatype = dtype;
        d.collApi.root = root;
        T.coll_api = start(c, &d);
      }
      /* NCCL keeps the thread's last CollApi handle (2.28-2.30 never clear
       * it): the task takes it, and the stop at the append's end repeats
       * on it whenever this call started none (the mask lacked CollApi). */
      op->api = T.coll_api;
      if (T.coll_api && !(mask & M_COLL_API_OF(release))) __atomic_fetch_add(&n_stale_stops, 1, __ATOMIC_RELAXED);
      stop(T.coll_api);
    }
  }
}

/* The user's call (ncclEnqueueCheck): an implicit group around it when the
 * caller opened none, its task(s) appended inside. From 2.28 ncclAlltoAll,
 * ncclGather and ncclScatter (not on the copy-engine path) append Send/Recv
 * tasks: P2pApi and P2p events named "Send"/"Recv" per peer, nothing that
 * names the collective. */
static int ce_func(const char *f) {
  return strcmp(f, "AllGather") == 0 || strcmp(f, "AlltoAll") == 0 || strcmp(f, "Gather") == 0 ||
         strcmp(f, "Scatter") == 0;
}

static void api_call(struct fp_comm *c, const char *func, size_t count, const char *dtype, int root, int nch, int p2p) {
  int implicit = T.depth == 0;
  if (implicit) T.depth++;
  /* NCCL >= 2.28 on the copy engines (SLOWRANK_FAKE_NCCL_CE: one node,
   * symmetric buffers, NCCL_CTA_POLICY_ZERO): 2.28's ceCollTaskAppend emits
   * no profiler event at all; 2.29's GroupApi, CollApi, and CeColl at the
   * launch. */
  if (ce_mode && !p2p && release >= 5 && ce_func(func)) {
    if (release >= 6) task_append(c, func, count, dtype, root, nch, 0, 1);
    if (implicit) fp_group_end();
    return;
  }
  int a2a = !p2p && release >= 5 && strcmp(func, "AlltoAll") == 0;
  int gather = !p2p && release >= 5 && strcmp(func, "Gather") == 0;
  int scatter = !p2p && release >= 5 && strcmp(func, "Scatter") == 0;
  if (a2a) {
    for (int r = 0; r < c->nranks; r++) {
      task_append(c, "Send", count, dtype, r, nch, 1, 0);
      task_append(c, "Recv", count, dtype, r, nch, 1, 0);
    }
  } else if (gather) {
    task_append(c, "Send", count, dtype, root, nch, 1, 0);
    for (int r = 0; c->rank == root && r < c->nranks; r++) task_append(c, "Recv", count, dtype, r, nch, 1, 0);
  } else if (scatter) {
    for (int r = 0; c->rank == root && r < c->nranks; r++) task_append(c, "Send", count, dtype, r, nch, 1, 0);
    task_append(c, "Recv", count, dtype, root, nch, 1, 0);
  } else {
    task_append(c, func, count, dtype, root, nch, p2p, 0);
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

/* ncclProfilerPluginFinalize: 2.27 calls finalize for every comm while
 * ncclProfiler is set, whatever its context; 2.28 only for a non-NULL
 * context. Then the unload: the last reference dlcloses the plugin and a
 * later comm loads it again. */
void fp_comm_destroy(struct fp_comm *c) {
  fp_proxy_drain();
  pthread_mutex_lock(&mu);
  if (active() && (release == 4 || c->ctx)) {
    if (version == 6)
      p6->finalize(c->ctx);
    else if (version == 5)
      p5->finalize(c->ctx);
    else
      p4->finalize(c->ctx);
  }
  if (c->held && --refcount == 0 && lib) {
    dlclose(lib);
    lib = NULL;
    __atomic_store_n(&version, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&plugin_off, 0, __ATOMIC_RELEASE);
    p6 = NULL;
    p5 = NULL;
    p4 = NULL;
  }
  pthread_mutex_unlock(&mu);
  pthread_mutex_destroy(&c->mu);
  free(c);
}
