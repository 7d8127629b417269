/*
 * ncclprof.h - a fake NCCL's profiler-plugin host (ncclprof.c): loads a
 * profiler plugin the way NCCL >= 2.27 does (NCCL_PROFILER_PLUGIN, dlopen,
 * newest ncclProfiler_vN first) and drives it as NCCL's src/plugin/profiler.cc
 * does for API v6, v5 and v4 (NCCL 2.29.7, 2.28.9, 2.27.7), without a GPU.
 * Used by cupti/test_nccl.c and linked into the fake libnccl.so.2 (nccl.c),
 * so one copy of the driving logic serves both.
 */
#ifndef FAKE_NCCLPROF_H
#define FAKE_NCCLPROF_H

#include <stddef.h>
#include <stdint.h>

struct fp_comm;

/* Loads the plugin (as NCCL: once, again only after the last comm's
 * unload; a failure is final). Returns the API version bound (6, 5 or 4), 0
 * when none (NCCL_PROFILER_PLUGIN=none, not found, no known symbol).
 * SLOWRANK_FAKE_NCCL_PROFILER_MAX names the NCCL release emulated: 4 =
 * 2.27.7 (lookup from v4), 5 = 2.28.9 (from v5; the default), 6 = 2.29.7
 * and 2.30.7 (from v6). SLOWRANK_FAKE_NCCL_CE=1 runs AllGather, AlltoAll,
 * Gather and Scatter on the copy engines (NCCL >= 2.28 on one node with
 * symmetric buffers and NCCL_CTA_POLICY_ZERO): invisible to 2.28's plugin,
 * CeColl events on 2.29's. */
int fp_load(void);

/* ncclCommInitRank: loads the plugin if needed, then its init for this comm
 * (an error: 2.27 turns the plugin off for the process, 2.28 carries on with
 * the context the plugin left). Never NULL. */
struct fp_comm *fp_comm_init(uint64_t comm_hash, int nranks, int rank);
/* 1 when the plugin's init succeeded for c. */
int fp_comm_profiled(const struct fp_comm *c);

/* The stepwise contract, as a fake NCCL's entry points reach it
 * (test/fakelibs/nccl.c): fp_group_start at ncclGroupStart, fp_api_coll /
 * fp_api_p2p inside each collective or send/recv call (CollApi/P2pApi
 * events; outside a group the call is its own group and ends here too;
 * from 2.28 "AlltoAll", "Gather" and "Scatter" become Send/Recv tasks),
 * fp_group_end at ncclGroupEnd (Group, Coll/P2p, kernel-channel jobs for the
 * proxy thread). State is per calling thread, as NCCL's. func is NCCL's
 * string ("AllReduce"), dtype its datatype string ("ncclFloat32"). */
void fp_group_start(void);
void fp_api_coll(struct fp_comm *c, const char *func, size_t count, const char *dtype, int root, int nchannels);
void fp_api_p2p(struct fp_comm *c, const char *func, size_t count, const char *dtype, int peer, int nchannels);
void fp_group_end(void);

/* Shorthands of the above. One collective outside a group (ncclAllReduce and friends): GroupApi,
 * CollApi at the call, Group + Coll at the implicit group end, KernelCh per
 * channel later from the proxy thread. func is NCCL's string ("AllReduce"),
 * dtype its datatype string ("ncclFloat32"). */
void fp_coll(struct fp_comm *c, const char *func, size_t count, const char *dtype, int root, int nchannels);
/* n collectives inside ncclGroupStart/End: API events per call, one Group,
 * then the Coll events at group end. */
void fp_group(struct fp_comm *c, int n, const char *const *funcs, const size_t *counts, const char *dtype,
              int nchannels);
/* A send or recv (P2pApi + P2p; no seq). */
void fp_p2p(struct fp_comm *c, const char *func, size_t count, const char *dtype, int peer, int nchannels);

/* ncclCommDestroy: waits for the comm's proxy work, then the plugin's finalize. */
void fp_comm_destroy(struct fp_comm *c);
/* Waits until the proxy thread ran every queued kernel-channel job. */
void fp_proxy_drain(void);

/* The process-wide activation mask (ncclProfilerEventMask) and how often
 * each KernelCh state was seen at op start (toggle tests). */
int fp_mask(void);
/* Another writer of that mask (the plugin stores into it only when its own
 * choice changes): NCCL runs with whatever was stored last. */
void fp_set_mask(int mask);
uint64_t fp_ops_with_kernel_ch(void);
uint64_t fp_ops_without_kernel_ch(void);
/* Stops NCCL repeated on a thread's stale CollApi handle (calls that
 * started none). */
uint64_t fp_stale_api_stops(void);

/* The bound plugin's raw entry points (abuse tests). */
void *fp_plugin(void);

/* The fake GPU's %globaltimer: CLOCK_REALTIME ns, as NVIDIA's driver keeps it
 * (plus SLOWRANK_FAKE_NCCL_GPU_SKEW_NS, a GPU clock off the host's). */
uint64_t fp_globaltimer(void);

#endif
