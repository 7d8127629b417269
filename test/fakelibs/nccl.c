//go:build ignore

/*
 * nccl.c — the fake libnccl.so.2. Communicators are shared-memory entries of
 * the simulated job (fakegpu.c); a collective only enqueues a communication
 * operation on the caller's stream and returns, like NCCL. The stream then
 * completes once every rank of the communicator reached the collective on its
 * own stream, plus a modelled transfer time (see xfer_ns below).
 *
 * As in NVIDIA's build (NCCL_API with PROFAPI), every ncclX is a WEAK symbol
 * and pncclX a global alias at the same address. Internal paths (InitAll,
 * Bcast, group end) never call the exported symbols, so a probe fires once
 * per user call.
 *
 * As NCCL >= 2.23 does, it loads a profiler plugin (NCCL_PROFILER_PLUGIN) at
 * a communicator's init and drives it from its calls and a proxy thread:
 * that logic is ncclprof.c's, shared with cupti/test_nccl.c. The plugin's
 * work runs inside the user's calls, as NCCL's does; without a plugin each
 * call pays one branch.
 *
 * Under SLOWRANK_FAKE_ECHO (echo.c, for the probe tests) the probed entry
 * points (collectives, groups, comm inits) return at once with values derived
 * from their arguments and touch neither the simulator nor the plugin.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "fakegpu.h"
#include "nccl.h"
#include "ncclprof.h"

#define NCCL_API(ret, func, ...)                                                                 \
  __attribute__((visibility("default"))) __attribute__((alias(#func))) ret p##func(__VA_ARGS__); \
  __attribute__((visibility("default"))) __attribute__((weak)) __attribute__((noinline)) ret func(__VA_ARGS__)

#define COMM_MAGIC 0x4e43434cu

struct ncclComm {
  uint32_t magic;
  int slot;
  int rank;
  int nranks;
  int device;
  int ready;            /* 0 while a grouped init still waits for peers */
  uint64_t coll_seq;    /* collectives issued on this communicator */
  uint64_t split_n;     /* splits issued */
  uint64_t *send_n;     /* [nranks] messages sent to each peer */
  uint64_t *recv_n;     /* [nranks] messages received from each peer */
  struct fp_comm *prof; /* the profiler plugin's view of this comm (never NULL) */
  unsigned char key[NCCL_UNIQUE_ID_BYTES];
};

struct pending {
  cudaStream_t stream;
  struct fg_inst_desc d;
};

static _Thread_local int g_depth;
static _Thread_local struct pending *g_pend;
static _Thread_local int g_npend, g_cap;
static _Thread_local ncclComm_t *g_inits;
static _Thread_local int g_ninits, g_initcap;
static _Thread_local ncclResult_t g_group_err;
static _Thread_local char g_last_error[256];

static ncclResult_t map_err(int e) {
  switch (e) {
  case FG_OK:
    return ncclSuccess;
  case FG_EINVAL:
    return ncclInvalidArgument;
  case FG_EUSAGE:
    return ncclInvalidUsage;
  case FG_ENOMEM:
    return ncclInternalError;
  case FG_EINIT:
    return ncclUnhandledCudaError;
  case FG_ETIMEDOUT:
    return ncclSystemError;
  case FG_EPEER:
    return ncclRemoteError;
  default:
    return ncclInternalError;
  }
}

static ncclResult_t fail(ncclResult_t r, const char *what) {
  if (r != ncclSuccess) snprintf(g_last_error, sizeof g_last_error, "fake nccl: %s: %s", what, ncclGetErrorString(r));
  return r;
}

static size_t type_size(ncclDataType_t t) {
  switch (t) {
  case ncclInt8:
  case ncclUint8:
  case ncclFloat8e4m3:
  case ncclFloat8e5m2:
    return 1;
  case ncclFloat16:
  case ncclBfloat16:
    return 2;
  case ncclInt32:
  case ncclUint32:
  case ncclFloat32:
    return 4;
  case ncclInt64:
  case ncclUint64:
  case ncclFloat64:
    return 8;
  default:
    return 0;
  }
}

/* Transfer time of `bytes` moved per rank: a latency plus bytes over the
 * modelled bus bandwidth (GB/s == bytes/ns). */
static uint64_t xfer_ns(double bytes) {
  const struct fg_params *p = slowrank_fake_params();
  return p->lat_ns + (uint64_t)(bytes / p->bw_gbps);
}

/* NCCL's profiler strings: ncclDatatypeToString, ncclFuncToString. */
static const char *type_name(ncclDataType_t t) {
  switch (t) {
  case ncclInt8:
    return "ncclInt8";
  case ncclUint8:
    return "ncclUint8";
  case ncclInt32:
    return "ncclInt32";
  case ncclUint32:
    return "ncclUint32";
  case ncclInt64:
    return "ncclInt64";
  case ncclUint64:
    return "ncclUint64";
  case ncclFloat16:
    return "ncclFloat16";
  case ncclFloat32:
    return "ncclFloat32";
  case ncclFloat64:
    return "ncclFloat64";
  case ncclBfloat16:
    return "ncclBfloat16";
  case ncclFloat8e4m3:
    return "ncclFloat8e4m3";
  case ncclFloat8e5m2:
    return "ncclFloat8e5m2";
  default:
    return "ncclUnknown";
  }
}

/* The channels a fake collective claims to run on (kernel-channel events). */
#define FAKE_NCHANNELS 2

/* NCCL's commHash is a hash of the ncclUniqueId (getHash), the same on
 * every rank; a split's key is derived per color, so its hash differs. */
static uint64_t key_hash(const unsigned char *key) {
  uint64_t h = 1469598103934665603ull;
  for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++) h = (h ^ key[i]) * 1099511628211ull;
  return h;
}

static int comm_valid(ncclComm_t c) { return c != NULL && c->magic == COMM_MAGIC; }

static void derive_key(unsigned char *out, const unsigned char *parent, uint64_t n, int color) {
  uint64_t h = 1469598103934665603ull;
  for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++) h = (h ^ parent[i]) * 1099511628211ull;
  for (int i = 0; i < 8; i++) h = (h ^ ((n >> (8 * i)) & 0xff)) * 1099511628211ull;
  for (int i = 0; i < 4; i++) h = (h ^ (((uint32_t)color >> (8 * i)) & 0xff)) * 1099511628211ull;
  memcpy(out, parent, NCCL_UNIQUE_ID_BYTES);
  memcpy(out, &h, sizeof h);
  out[NCCL_UNIQUE_ID_BYTES - 1] ^= 0x5a; /* never equal to a root id */
}

static void fill_unique_id(unsigned char *id) {
  memset(id, 0, NCCL_UNIQUE_ID_BYTES);
  /* ncclBootstrapHandle-like: 8 random magic bytes, then a sockaddr_in of
   * the "root" (AF_INET, MASTER_PORT or 0, 127.0.0.1). */
  uint64_t magic = 0;
  if (getrandom(&magic, sizeof magic, 0) != (ssize_t)sizeof magic) {
    magic = slowrank_fake_now_ns() ^ ((uint64_t)(uintptr_t)id << 17);
  }
  memcpy(id, &magic, sizeof magic);
  const char *port = getenv("MASTER_PORT");
  unsigned p = port ? (unsigned)atoi(port) : 0;
  id[8] = 2; /* AF_INET, little endian sa_family */
  id[9] = 0;
  id[10] = (unsigned char)(p >> 8);
  id[11] = (unsigned char)p;
  id[12] = 127;
  id[15] = 1;
}

static ncclResult_t new_handle(ncclComm_t *out, int slot, int nranks, int rank, const unsigned char *key) {
  struct ncclComm *c = calloc(1, sizeof *c);
  uint64_t *sn = calloc((size_t)nranks, sizeof *sn), *rn = calloc((size_t)nranks, sizeof *rn);
  if (!c || !sn || !rn) {
    free(c);
    free(sn);
    free(rn);
    return ncclSystemError;
  }
  c->magic = COMM_MAGIC;
  c->slot = slot;
  c->rank = rank;
  c->nranks = nranks;
  c->device = rank;
  const char *lr = getenv("LOCAL_RANK");
  if (lr && *lr) c->device = atoi(lr);
  c->send_n = sn;
  c->recv_n = rn;
  memcpy(c->key, key, NCCL_UNIQUE_ID_BYTES);
  /* NCCL loads the plugin (once) and inits it for each new comm. */
  fp_load();
  c->prof = fp_comm_init(key_hash(key), nranks, rank);
  *out = c;
  return ncclSuccess;
}

static void free_handle(ncclComm_t c) {
  if (!c) return;
  fp_comm_destroy(c->prof); /* the plugin's finalize; the last one unloads it */
  c->magic = 0;
  free(c->send_n);
  free(c->recv_n);
  free(c);
}

/* Join and (outside a group) wait for every rank. */
static ncclResult_t init_rank(ncclComm_t *comm, int nranks, const unsigned char *key, int rank) {
  if (!comm) return fail(ncclInvalidArgument, "comm is NULL");
  *comm = NULL;
  if (nranks < 1 || nranks > FG_MAX_RANKS || rank < 0 || rank >= nranks)
    return fail(ncclInvalidArgument, "bad nranks or rank");
  int slot = -1;
  ncclResult_t r = map_err(slowrank_fake_comm_join(key, nranks, rank, &slot));
  if (r != ncclSuccess) return fail(r, "join communicator");
  ncclComm_t c = NULL;
  r = new_handle(&c, slot, nranks, rank, key);
  if (r != ncclSuccess) {
    slowrank_fake_comm_leave(slot, rank);
    return fail(r, "allocate communicator");
  }
  if (g_depth > 0) {
    if (g_ninits == g_initcap) {
      int cap = g_initcap ? 2 * g_initcap : 8;
      ncclComm_t *n = realloc(g_inits, sizeof *n * (size_t)cap);
      if (!n) {
        slowrank_fake_comm_leave(slot, rank);
        free_handle(c);
        return fail(ncclSystemError, "group init");
      }
      g_inits = n;
      g_initcap = cap;
    }
    g_inits[g_ninits++] = c;
    *comm = c;
    return ncclSuccess;
  }
  r = map_err(slowrank_fake_comm_wait_ready(slot));
  if (r != ncclSuccess) {
    slowrank_fake_comm_leave(slot, rank);
    free_handle(c);
    return fail(r, "wait for all ranks");
  }
  c->ready = 1;
  *comm = c;
  return ncclSuccess;
}

/* The simulated device's side of a call: its instance, queued on the
 * stream now or at the group end. Arguments are checked. */
static ncclResult_t enqueue_inst(ncclComm_t comm, cudaStream_t stream, int kind, int peer, int is_send, double bytes) {
  slowrank_fake_spin_ns(slowrank_fake_params()->launch_ns);
  struct fg_inst_desc d = {.comm = comm->slot, .kind = kind, .rank = comm->rank, .xfer_ns = xfer_ns(bytes)};
  if (kind == FG_INST_COLL) {
    d.seq = comm->coll_seq++;
  } else {
    d.peer = peer;
    d.is_send = is_send;
    d.seq = is_send ? comm->send_n[peer]++ : comm->recv_n[peer]++;
  }
  if (g_depth > 0) {
    if (g_npend == g_cap) {
      int cap = g_cap ? 2 * g_cap : 32;
      struct pending *n = realloc(g_pend, sizeof *n * (size_t)cap);
      if (!n) return fail(ncclSystemError, "group queue");
      g_pend = n;
      g_cap = cap;
    }
    g_pend[g_npend].stream = stream;
    g_pend[g_npend].d = d;
    g_npend++;
    return ncclSuccess;
  }
  return fail(map_err(slowrank_fake_comm_enqueue(stream, &d, 1)), "enqueue");
}

/* What the profiler plugin is told about one call. */
struct call {
  const char *func; /* ncclFuncToString */
  size_t count;
  ncclDataType_t type;
  int root; /* -1 when none */
};

static void group_start_impl(void) {
  g_depth++;
  fp_group_start();
}

static ncclResult_t enqueue(ncclComm_t comm, cudaStream_t stream, int kind, int peer, int is_send, double bytes,
                            struct call call) {
  if (!comm_valid(comm)) return fail(ncclInvalidArgument, "invalid communicator");
  if (!comm->ready) return fail(ncclInvalidUsage, "communicator not initialised");
  if (kind != FG_INST_COLL && (peer < 0 || peer >= comm->nranks)) return fail(ncclInvalidArgument, "bad peer");
  /* The call's API event, then (outside a group) its own group end after
   * the enqueue: NCCL's ncclEnqueueCheck around taskAppend and the launch. */
  int implicit = g_depth == 0;
  if (implicit) fp_group_start();
  if (kind == FG_INST_COLL)
    fp_api_coll(comm->prof, call.func, call.count, type_name(call.type), call.root, FAKE_NCHANNELS);
  else
    fp_api_p2p(comm->prof, call.func, call.count, type_name(call.type), peer, FAKE_NCHANNELS);
  ncclResult_t r = enqueue_inst(comm, stream, kind, peer, is_send, bytes);
  if (implicit) fp_group_end();
  return r;
}
static int nranks_of(ncclComm_t c) { return comm_valid(c) ? c->nranks : 1; }

static ncclResult_t check_type(ncclDataType_t t) {
  return type_size(t) ? ncclSuccess : fail(ncclInvalidArgument, "bad datatype");
}

static ncclResult_t check_op(ncclRedOp_t op) {
  return (op >= ncclSum && op < ncclNumOps) ? ncclSuccess : fail(ncclInvalidArgument, "bad reduction op");
}

static ncclResult_t broadcast_impl(size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                                   cudaStream_t stream) {
  if (check_type(datatype) != ncclSuccess) return ncclInvalidArgument;
  if (comm_valid(comm) && (root < 0 || root >= comm->nranks)) return fail(ncclInvalidArgument, "bad root");
  int n = nranks_of(comm);
  return enqueue(comm, stream, FG_INST_COLL, 0, 0, n > 1 ? (double)count * (double)type_size(datatype) : 0,
                 (struct call){"Broadcast", count, datatype, root});
}

static ncclResult_t group_end_impl(void) {
  if (g_depth <= 0) return fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--g_depth > 0) {
    fp_group_end(); /* nested: only the depth */
    return ncclSuccess;
  }
  ncclResult_t r = g_group_err;
  for (int i = 0; i < g_ninits; i++) {
    ncclComm_t c = g_inits[i];
    ncclResult_t e = map_err(slowrank_fake_comm_wait_ready(c->slot));
    if (e == ncclSuccess)
      c->ready = 1;
    else if (r == ncclSuccess)
      r = fail(e, "wait for all ranks");
  }
  g_ninits = 0;
  /* One fused operation per stream, in order of first use. */
  struct fg_inst_desc *tmp = g_npend ? malloc(sizeof *tmp * (size_t)g_npend) : NULL;
  if (g_npend && !tmp) r = fail(ncclSystemError, "group end");
  for (int i = 0; tmp && i < g_npend; i++) {
    if (g_pend[i].d.kind == 0) continue; /* already taken with an earlier stream */
    cudaStream_t s = g_pend[i].stream;
    int n = 0;
    for (int j = i; j < g_npend; j++) {
      if (g_pend[j].d.kind != 0 && g_pend[j].stream == s) {
        tmp[n++] = g_pend[j].d;
        g_pend[j].d.kind = 0;
      }
    }
    ncclResult_t e = map_err(slowrank_fake_comm_enqueue(s, tmp, n));
    if (e != ncclSuccess && r == ncclSuccess) r = fail(e, "group enqueue");
  }
  free(tmp);
  g_npend = 0;
  g_group_err = ncclSuccess;
  fp_group_end(); /* the group's plugin events, after its launch */
  return r;
}

/* Echo mode (echo.c): a comm init reports a handle derived from its
 * arguments (the probe test checks that BPF read them from the right place)
 * and joins nothing. */
static ncclResult_t echo_comm(ncclComm_t *out, uintptr_t v) {
  if (out) *out = (ncclComm_t)v;
  return ncclSuccess;
}

/* Not NCCL: an exported function that does nothing, the calibration target
 * of bpf/bench_test.go (the kernel's uprobe cost alone). Never called by the
 * fake itself. */
void slowrank_fake_nccl_noop(void);
static volatile long noop_calls;
__attribute__((visibility("default"))) __attribute__((noinline)) void slowrank_fake_nccl_noop(void) { noop_calls++; }

/* ---- API ---- */

NCCL_API(ncclResult_t, ncclGetVersion, int *version);
ncclResult_t ncclGetVersion(int *version) {
  if (!version) return ncclInvalidArgument;
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

NCCL_API(const char *, ncclGetErrorString, ncclResult_t result);
const char *ncclGetErrorString(ncclResult_t result) {
  switch (result) {
  case ncclSuccess:
    return "no error";
  case ncclUnhandledCudaError:
    return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
  case ncclSystemError:
    return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
  case ncclInternalError:
    return "internal error - please report this issue to the NCCL developers";
  case ncclInvalidArgument:
    return "invalid argument (run with NCCL_DEBUG=WARN for details)";
  case ncclInvalidUsage:
    return "invalid usage (run with NCCL_DEBUG=WARN for details)";
  case ncclRemoteError:
    return "remote process exited or there was a network error";
  case ncclInProgress:
    return "NCCL operation in progress";
  default:
    return "unknown result code";
  }
}

NCCL_API(const char *, ncclGetLastError, ncclComm_t comm);
const char *ncclGetLastError(ncclComm_t comm) {
  (void)comm;
  return g_last_error;
}

NCCL_API(ncclResult_t, ncclGetUniqueId, ncclUniqueId *uniqueId);
ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId) {
  if (!uniqueId) return fail(ncclInvalidArgument, "uniqueId is NULL");
  /* No device state needed: a launcher may create the id and fork ranks. */
  fill_unique_id((unsigned char *)uniqueId->internal);
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommInitRank, ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank);
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank) {
  if (slowrank_fake_echo())
    return echo_comm(comm, 0xabc000u + (uintptr_t)rank * 0x100 + (unsigned char)commId.internal[5]);
  return init_rank(comm, nranks, (const unsigned char *)commId.internal, rank);
}

NCCL_API(ncclResult_t, ncclCommInitRankConfig, ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
         ncclConfig_t *config);
ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t *config) {
  if (slowrank_fake_echo())
    return echo_comm(comm, 0xbcd000u + (uintptr_t)rank * 0x100 + (unsigned char)commId.internal[127]);
  (void)config; /* blocking semantics whatever the config says */
  return init_rank(comm, nranks, (const unsigned char *)commId.internal, rank);
}

NCCL_API(ncclResult_t, ncclCommInitAll, ncclComm_t *comm, int ndev, const int *devlist);
ncclResult_t ncclCommInitAll(ncclComm_t *comm, int ndev, const int *devlist) {
  if (slowrank_fake_echo()) {
    for (int i = 0; comm && i < ndev; i++) echo_comm(&comm[i], 0xcde000u + (uintptr_t)i);
    return ncclSuccess;
  }
  if (!comm || ndev < 1 || ndev > FG_MAX_RANKS) return fail(ncclInvalidArgument, "bad ndev");
  int e = slowrank_fake_init();
  if (e != FG_OK) return fail(map_err(e), "init");
  unsigned char key[NCCL_UNIQUE_ID_BYTES];
  fill_unique_id(key);
  group_start_impl();
  ncclResult_t r = ncclSuccess;
  for (int i = 0; i < ndev && r == ncclSuccess; i++) {
    r = init_rank(&comm[i], ndev, key, i);
    if (r == ncclSuccess && devlist) comm[i]->device = devlist[i];
  }
  ncclResult_t r2 = group_end_impl();
  return r != ncclSuccess ? r : r2;
}

NCCL_API(ncclResult_t, ncclCommSplit, ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config);
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config) {
  if (slowrank_fake_echo()) return echo_comm(newcomm, (uintptr_t)comm + 0x10000u + (uintptr_t)color);
  (void)config;
  if (!comm_valid(comm) || !newcomm) return fail(ncclInvalidArgument, "bad communicator");
  if (color < 0 && color != NCCL_SPLIT_NOCOLOR) return fail(ncclInvalidArgument, "bad color");
  *newcomm = NULL;
  uint64_t n = comm->split_n++;
  int nr = 0, nn = 0;
  ncclResult_t r = map_err(slowrank_fake_comm_split(comm->slot, comm->rank, n, color, key, &nr, &nn));
  if (r != ncclSuccess) return fail(r, "split exchange");
  if (color == NCCL_SPLIT_NOCOLOR) return ncclSuccess;
  unsigned char k[NCCL_UNIQUE_ID_BYTES];
  derive_key(k, comm->key, n, color);
  return init_rank(newcomm, nn, k, nr);
}

/* NCCL 2.23+: the ranks share nId ids to spread the bootstrap; every id
 * names the same communicator, so the first one is its key here. */
NCCL_API(ncclResult_t, ncclCommInitRankScalable, ncclComm_t *newcomm, int nranks, int myrank, int nId,
         ncclUniqueId *commIds, ncclConfig_t *config);
ncclResult_t ncclCommInitRankScalable(ncclComm_t *newcomm, int nranks, int myrank, int nId, ncclUniqueId *commIds,
                                      ncclConfig_t *config) {
  (void)config; /* blocking semantics whatever the config says */
  if (slowrank_fake_echo()) return echo_comm(newcomm, 0xdef000u + (uintptr_t)myrank);
  if (nId < 1 || !commIds) return fail(ncclInvalidArgument, "no unique id");
  return init_rank(newcomm, nranks, (const unsigned char *)commIds[0].internal, myrank);
}

NCCL_API(ncclResult_t, ncclCommFinalize, ncclComm_t comm);
ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  if (!comm_valid(comm)) return fail(ncclInvalidArgument, "bad communicator");
  return fail(map_err(slowrank_fake_device_sync()), "finalize");
}

NCCL_API(ncclResult_t, ncclCommDestroy, ncclComm_t comm);
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == NULL) return ncclSuccess;
  if (!comm_valid(comm)) return fail(ncclInvalidArgument, "bad communicator");
  (void)slowrank_fake_device_sync(); /* flush outstanding work, as a blocking destroy does */
  slowrank_fake_comm_leave(comm->slot, comm->rank);
  free_handle(comm);
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommAbort, ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm == NULL) return ncclSuccess;
  if (!comm_valid(comm)) return fail(ncclInvalidArgument, "bad communicator");
  slowrank_fake_comm_leave(comm->slot, comm->rank);
  free_handle(comm);
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommGetAsyncError, ncclComm_t comm, ncclResult_t *asyncError);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError) {
  if (!comm_valid(comm) || !asyncError) return fail(ncclInvalidArgument, "bad argument");
  *asyncError = map_err(slowrank_fake_comm_status(comm->slot));
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommCount, const ncclComm_t comm, int *count);
ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
  if (!comm_valid(comm) || !count) return fail(ncclInvalidArgument, "bad argument");
  *count = comm->nranks;
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommCuDevice, const ncclComm_t comm, int *device);
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device) {
  if (!comm_valid(comm) || !device) return fail(ncclInvalidArgument, "bad argument");
  *device = comm->device;
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommUserRank, const ncclComm_t comm, int *rank);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
  if (!comm_valid(comm) || !rank) return fail(ncclInvalidArgument, "bad argument");
  *rank = comm->rank;
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclReduce, const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
         ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream) {
  if (slowrank_fake_echo()) return ncclSuccess;
  (void)sendbuff;
  (void)recvbuff;
  if (check_type(datatype) != ncclSuccess || check_op(op) != ncclSuccess) return ncclInvalidArgument;
  if (comm_valid(comm) && (root < 0 || root >= comm->nranks)) return fail(ncclInvalidArgument, "bad root");
  int n = nranks_of(comm);
  return enqueue(comm, stream, FG_INST_COLL, 0, 0, n > 1 ? (double)count * (double)type_size(datatype) : 0,
                 (struct call){"Reduce", count, datatype, root});
}

NCCL_API(ncclResult_t, ncclBcast, void *buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
         cudaStream_t stream);
ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                       cudaStream_t stream) {
  if (slowrank_fake_echo()) return ncclSuccess;
  /* As NCCL's src/collectives.cc: the legacy in-place call is a call of
   * ncclBroadcast, whose uprobe fires inside this one's. */
  return ncclBroadcast(buff, buff, count, datatype, root, comm, stream);
}

NCCL_API(ncclResult_t, ncclBroadcast, const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
         int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
  if (slowrank_fake_echo()) return ncclSuccess;
  (void)sendbuff;
  (void)recvbuff;
  return broadcast_impl(count, datatype, root, comm, stream);
}

NCCL_API(ncclResult_t, ncclAllReduce, const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
         ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  if (slowrank_fake_echo()) return (ncclResult_t)(count % 3); /* differs per call */
  (void)sendbuff;
  (void)recvbuff;
  if (check_type(datatype) != ncclSuccess || check_op(op) != ncclSuccess) return ncclInvalidArgument;
  int n = nranks_of(comm);
  double bytes = (double)count * (double)type_size(datatype) * 2.0 * (double)(n - 1) / (double)n;
  return enqueue(comm, stream, FG_INST_COLL, 0, 0, bytes, (struct call){"AllReduce", count, datatype, -1});
}

NCCL_API(ncclResult_t, ncclReduceScatter, const void *sendbuff, void *recvbuff, size_t recvcount,
         ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  if (slowrank_fake_echo()) return ncclSuccess;
  (void)sendbuff;
  (void)recvbuff;
  if (check_type(datatype) != ncclSuccess || check_op(op) != ncclSuccess) return ncclInvalidArgument;
  int n = nranks_of(comm);
  return enqueue(comm, stream, FG_INST_COLL, 0, 0, (double)recvcount * (double)type_size(datatype) * (n - 1),
                 (struct call){"ReduceScatter", recvcount, datatype, -1});
}

NCCL_API(ncclResult_t, ncclAllGather, const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
         ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
  if (slowrank_fake_echo()) return ncclSuccess;
  (void)sendbuff;
  (void)recvbuff;
  if (check_type(datatype) != ncclSuccess) return ncclInvalidArgument;
  int n = nranks_of(comm);
  return enqueue(comm, stream, FG_INST_COLL, 0, 0, (double)sendcount * (double)type_size(datatype) * (n - 1),
                 (struct call){"AllGather", sendcount, datatype, -1});
}

NCCL_API(ncclResult_t, ncclAlltoAll, const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
         ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAlltoAll(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclComm_t comm,
                          cudaStream_t stream) {
  if (slowrank_fake_echo()) return ncclSuccess;
  (void)sendbuff;
  (void)recvbuff;
  if (check_type(datatype) != ncclSuccess) return ncclInvalidArgument;
  int n = nranks_of(comm);
  return enqueue(comm, stream, FG_INST_COLL, 0, 0, (double)count * (double)type_size(datatype) * (n - 1),
                 (struct call){"AlltoAll", count, datatype, -1});
}

/* RCCL's spelling, same address as ncclAlltoAll. */
__attribute__((visibility("default"))) __attribute__((weak)) __attribute__((alias("ncclAlltoAll"))) ncclResult_t
ncclAllToAll(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclComm_t comm,
             cudaStream_t stream);
__attribute__((visibility("default"))) __attribute__((alias("ncclAlltoAll"))) ncclResult_t pncclAllToAll(
    const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);

NCCL_API(ncclResult_t, ncclSend, const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
         cudaStream_t stream);
ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  if (slowrank_fake_echo()) return ncclSuccess;
  (void)sendbuff;
  if (check_type(datatype) != ncclSuccess) return ncclInvalidArgument;
  return enqueue(comm, stream, FG_INST_P2P, peer, 1, (double)count * (double)type_size(datatype),
                 (struct call){"Send", count, datatype, -1});
}

NCCL_API(ncclResult_t, ncclRecv, void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
         cudaStream_t stream);
ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  if (slowrank_fake_echo()) return ncclSuccess;
  (void)recvbuff;
  if (check_type(datatype) != ncclSuccess) return ncclInvalidArgument;
  return enqueue(comm, stream, FG_INST_P2P, peer, 0, (double)count * (double)type_size(datatype),
                 (struct call){"Recv", count, datatype, -1});
}

NCCL_API(ncclResult_t, ncclGroupStart, void);
ncclResult_t ncclGroupStart(void) {
  if (slowrank_fake_echo()) return ncclSuccess;
  group_start_impl();
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclGroupEnd, void);
ncclResult_t ncclGroupEnd(void) {
  if (slowrank_fake_echo()) return ncclSuccess;
  return group_end_impl();
}
