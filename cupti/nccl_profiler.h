//go:build ignore

/*
 * nccl_profiler.h - NCCL's profiler plugin ABI, versions 4 and 5, as the
 * plugin side sees it. Written for slowrank (no NCCL header is available on
 * the build hosts, and the plugin must not depend on an NCCL install).
 *
 * PROVENANCE (verify against the upstream tags before trusting a change):
 *   v5: NVIDIA/nccl src/include/plugin/profiler/profiler_v5.h and
 *       ext-profiler/example/nccl/profiler_v5.h; API v5 first shipped in
 *       NCCL 2.28 (torch 2.11 cu130 pins nvidia-nccl-cu13 2.28.9). Read from
 *       stored copies of NVIDIA/nccl (commits f1308997, 56a409d2), not from
 *       the v2.28.9-1 tag itself.
 *   v4: NVIDIA/nccl ext-profiler/example/nccl/profiler_v4.h (NCCL 2.27).
 *   Event types and states: src/include/plugin/nccl_profiler.h (commit
 *       51c58fd6); the numeric values are fixed across versions.
 * Only the fields slowrank reads are relied on, and their offsets are pinned
 * below with _Static_assert (x86-64 and aarch64 LP64): the descriptor's
 * union starts at offset 24 in both versions, so one reader serves both;
 * only `type` differs (uint8_t in v4, uint64_t in v5: read it by version).
 * Trailing fields some copies of the header carry (coll.parentGroup,
 * p2p.parentGroup "for backward compatibility with v4"; userTag in v7) are
 * declared where seen but never read: a release without them must not make
 * us read past NCCL's descriptor.
 */
#ifndef SLOWRANK_NCCL_PROFILER_H
#define SLOWRANK_NCCL_PROFILER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* ncclResult_t: only the values a plugin returns. */
typedef int sr_nccl_result_t;
#define SR_NCCL_SUCCESS 0
#define SR_NCCL_INTERNAL_ERROR 3

/* ncclDebugLogger_t: (level, flags, file, line, fmt, ...). Never called. */
typedef void (*sr_nccl_logger_t)(int level, unsigned long flags, const char *file, int line, const char *fmt, ...);

/* Event types (ncclProfile*), one bit each in the activation mask. */
enum {
	SR_NCCL_PROFILE_GROUP = 1 << 0,
	SR_NCCL_PROFILE_COLL = 1 << 1,
	SR_NCCL_PROFILE_P2P = 1 << 2,
	SR_NCCL_PROFILE_PROXY_OP = 1 << 3,
	SR_NCCL_PROFILE_PROXY_STEP = 1 << 4,
	SR_NCCL_PROFILE_PROXY_CTRL = 1 << 5,
	SR_NCCL_PROFILE_KERNEL_CH = 1 << 6,
	SR_NCCL_PROFILE_NET_PLUGIN = 1 << 7,
	SR_NCCL_PROFILE_GROUP_API = 1 << 8,      /* v5 */
	SR_NCCL_PROFILE_COLL_API = 1 << 9,       /* v5 */
	SR_NCCL_PROFILE_P2P_API = 1 << 10,       /* v5 */
	SR_NCCL_PROFILE_KERNEL_LAUNCH = 1 << 11, /* v5 */
};

/* Event states (ncclProfilerEventState_t) slowrank acts on. */
#define SR_NCCL_STATE_KERNEL_CH_STOP 22 /* ncclProfilerKernelChStop: args->kernelCh.pTimer = GPU stop */
#define SR_NCCL_STATE_GROUP_START_API_STOP 23
#define SR_NCCL_STATE_GROUP_END_API_START 24

/* The descriptor's union (ncclProfilerEventDescr_v5_t / _v4_t from offset 24). */
union sr_nccl_descr_u {
	struct {
		bool graphCaptured; /* int in the example plugin's copy; never read */
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
		/* v5 copies add: void *parentGroup; never read */
	} coll;
	struct {
		const char *func;
		void *buff;
		const char *datatype;
		size_t count;
		int peer;
		uint8_t nChannels;
		/* v5 copies add: void *parentGroup; never read */
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
		uint64_t pTimer; /* start, GPU %globaltimer ns */
	} kernelCh;
	struct {
		int64_t id;
		void *data;
	} netPlugin;
};

typedef struct {
	uint64_t type; /* uint8_t in v4: see sr_nccl_descr_v4_t */
	void *parentObj;
	int rank;
	union sr_nccl_descr_u u;
} sr_nccl_descr_v5_t;

typedef struct {
	uint8_t type;
	void *parentObj;
	int rank;
	union sr_nccl_descr_u u;
} sr_nccl_descr_v4_t;

/* ncclProfilerEventStateArgs_v5_t == _v4_t */
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
		uint64_t pTimer; /* GPU %globaltimer ns at the channel's stop */
	} kernelCh;
} sr_nccl_state_args_t;

/* ncclProfiler_v5_t: init(ctx, commId, mask*, commName, nNodes, nranks, rank, logfn). */
typedef struct {
	const char *name;
	sr_nccl_result_t (*init)(void **context, uint64_t commId, int *eActivationMask, const char *commName,
				 int nNodes, int nranks, int rank, sr_nccl_logger_t logfn);
	sr_nccl_result_t (*startEvent)(void *context, void **eHandle, sr_nccl_descr_v5_t *eDescr);
	sr_nccl_result_t (*stopEvent)(void *eHandle);
	sr_nccl_result_t (*recordEventState)(void *eHandle, int eState, sr_nccl_state_args_t *eStateArgs);
	sr_nccl_result_t (*finalize)(void *context);
} sr_nccl_profiler_v5_t;

/* ncclProfiler_v4_t: init(ctx, mask*, commName, commHash, nNodes, nranks, rank, logfn). */
typedef struct {
	const char *name;
	sr_nccl_result_t (*init)(void **context, int *eActivationMask, const char *commName, uint64_t commHash,
				 int nNodes, int nranks, int rank, sr_nccl_logger_t logfn);
	sr_nccl_result_t (*startEvent)(void *context, void **eHandle, sr_nccl_descr_v4_t *eDescr);
	sr_nccl_result_t (*stopEvent)(void *eHandle);
	sr_nccl_result_t (*recordEventState)(void *eHandle, int eState, sr_nccl_state_args_t *eStateArgs);
	sr_nccl_result_t (*finalize)(void *context);
} sr_nccl_profiler_v4_t;

#if defined(__LP64__)
#define SR_NCCL_ASSERT(c, m) _Static_assert(c, m)
SR_NCCL_ASSERT(offsetof(sr_nccl_descr_v5_t, parentObj) == 8, "v5 parentObj");
SR_NCCL_ASSERT(offsetof(sr_nccl_descr_v5_t, rank) == 16, "v5 rank");
SR_NCCL_ASSERT(offsetof(sr_nccl_descr_v5_t, u) == 24, "v5 union");
SR_NCCL_ASSERT(offsetof(sr_nccl_descr_v4_t, u) == 24, "v4 union");
SR_NCCL_ASSERT(offsetof(union sr_nccl_descr_u, coll.seqNumber) == 0, "coll.seqNumber");
SR_NCCL_ASSERT(offsetof(union sr_nccl_descr_u, coll.func) == 8, "coll.func");
SR_NCCL_ASSERT(offsetof(union sr_nccl_descr_u, coll.count) == 32, "coll.count");
SR_NCCL_ASSERT(offsetof(union sr_nccl_descr_u, coll.root) == 40, "coll.root");
SR_NCCL_ASSERT(offsetof(union sr_nccl_descr_u, coll.datatype) == 48, "coll.datatype");
SR_NCCL_ASSERT(offsetof(union sr_nccl_descr_u, coll.nChannels) == 56, "coll.nChannels");
SR_NCCL_ASSERT(offsetof(union sr_nccl_descr_u, coll.algo) == 64, "coll.algo");
SR_NCCL_ASSERT(offsetof(union sr_nccl_descr_u, coll.proto) == 72, "coll.proto");
SR_NCCL_ASSERT(offsetof(union sr_nccl_descr_u, p2p.count) == 24, "p2p.count");
SR_NCCL_ASSERT(offsetof(union sr_nccl_descr_u, p2p.peer) == 32, "p2p.peer");
SR_NCCL_ASSERT(offsetof(union sr_nccl_descr_u, p2p.nChannels) == 36, "p2p.nChannels");
SR_NCCL_ASSERT(offsetof(union sr_nccl_descr_u, collApi.count) == 8, "collApi.count");
SR_NCCL_ASSERT(offsetof(union sr_nccl_descr_u, collApi.root) == 24, "collApi.root");
SR_NCCL_ASSERT(offsetof(union sr_nccl_descr_u, collApi.graphCaptured) == 40, "collApi.graphCaptured");
SR_NCCL_ASSERT(offsetof(union sr_nccl_descr_u, p2pApi.graphCaptured) == 32, "p2pApi.graphCaptured");
SR_NCCL_ASSERT(offsetof(union sr_nccl_descr_u, kernelCh.pTimer) == 8, "kernelCh.pTimer");
#undef SR_NCCL_ASSERT
#endif

#endif /* SLOWRANK_NCCL_PROFILER_H */
