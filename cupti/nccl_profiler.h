//go:build ignore

/*
 * nccl_profiler.h - NCCL's profiler plugin ABI, versions 4, 5 and 6, as the
 * plugin side sees it. Written for slowrank: the plugin must not depend on
 * an NCCL install, and no NCCL header is on the build hosts.
 *
 * PROVENANCE: checked field by field against the release tags of
 * NVIDIA/nccl, whose headers are vendored for that check only
 * (third_party/nccl/, README.md there) and compared at build time by
 * cupti/test_nccl_abi.c (`make cupti-nccl-abi`, part of cupti-test):
 *   v4: src/include/plugin/profiler/profiler_v4.h, v2.27.7-1 (593de54e) and
 *       v2.28.9-1 (dbc86fd0); the file is the same in every 2.27 and 2.28
 *       tag (NCCL 2.27.x binds v4 natively).
 *   v5: src/include/plugin/profiler/profiler_v5.h, v2.28.9-1 (dbc86fd0),
 *       what torch 2.11 cu130 ships (nvidia-nccl-cu13 2.28.9); the same in
 *       v2.28.3-1 and v2.28.7-1.
 *   v6: src/include/plugin/profiler/profiler_v6.h, v2.29.7-1 (b91894bd) and
 *       v2.30.7-1 (73cf1122); the layout is the same in both (2.30 only
 *       renames proxyOp.pid's type to ncclPid_t, pid_t on Linux). Apache-2.0
 *       from 2.29, so not vendored: checked with `make cupti-nccl-abi-src
 *       NCCL_SRC=<checkout>` at both tags; the offsets are pinned below.
 *   Event types, states and mask bits: src/include/plugin/nccl_profiler.h
 *       of the same tags (values fixed across versions; 23/24 from 2.28,
 *       CeColl/CeSync/CeBatch and states 25-30 from 2.29).
 *   Symbols: NCCL dlsyms "ncclProfiler_v5" then "_v4" ... "_v1" (2.28,
 *       src/plugin/profiler.cc and profiler/profiler_vN.cc); 2.27 starts at
 *       "_v4"; 2.29 and 2.30 start at "_v6" and reach v5 through a shim.
 * The descriptors' unions start at offset 24 in every version; only `type`
 * differs (uint8_t in v4, uint64_t from v5: read it by version). One
 * reading view, union sr_nccl_descr_u (v6's: v5's members and the three
 * copy-engine ones, none larger than coll, so v5's and v6's descriptors are
 * one type), serves v4 too: every v4 member is a prefix of the v5 member of
 * the same name at the same offsets (asserted below), and the plugin reads
 * nothing past v4's end from a v4 descriptor. coll.parentGroup /
 * p2p.parentGroup (v5) are declared for the layout, never read.
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
	SR_NCCL_PROFILE_CE_COLL = 1 << 12,       /* v6: a copy-engine collective, instead of Coll */
	SR_NCCL_PROFILE_CE_SYNC = 1 << 13,       /* v6: its synchronisations */
	SR_NCCL_PROFILE_CE_BATCH = 1 << 14,      /* v6: its batches of copies */
};

/* Event states (ncclProfilerEventState_t) slowrank acts on. */
#define SR_NCCL_STATE_KERNEL_CH_STOP 22 /* ncclProfilerKernelChStop: args->kernelCh.pTimer = GPU stop */
#define SR_NCCL_STATE_GROUP_START_API_STOP 23
#define SR_NCCL_STATE_GROUP_END_API_START 24

/* ncclProfilerEventDescr_v6_t's union (v5's plus the CE members): the
 * reading view of every version. */
union sr_nccl_descr_u {
	struct {
		bool graphCaptured; /* bool in NCCL's own header (int in its example plugin's copy); never read */
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
		void *parentGroup; /* v5: the Group event (v4's parentObj); never read */
	} coll;
	struct {
		const char *func;
		void *buff;
		const char *datatype;
		size_t count;
		int peer;
		uint8_t nChannels;
		void *parentGroup; /* v5; never read */
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
	struct {
		uint64_t seqNumber; /* the comm's CE counter (ceSeqNum), not seqNumber[func] */
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
	} ceColl; /* v6 */
	struct {
		bool isComplete;
		int nRanks;
	} ceCollSync; /* v6 */
	struct {
		int numOps;
		size_t totalBytes;
		bool useIntraSync;
	} ceCollBatch; /* v6 */
};

/* ncclProfilerEventDescr_v4_t's union, exactly (the layout tests compare
 * sizes); the plugin reads a v4 descriptor through sr_nccl_descr_u. */
union sr_nccl_descr_v4_u {
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

/* ncclProfilerEventDescr_v5_t and _v6_t (the CE members occur in v6 only). */
typedef struct {
	uint64_t type; /* uint8_t in v4: see sr_nccl_descr_v4_t */
	void *parentObj;
	int rank;
	union sr_nccl_descr_u u;
} sr_nccl_descr_v5_t;
typedef sr_nccl_descr_v5_t sr_nccl_descr_v6_t;

typedef struct {
	uint8_t type;
	void *parentObj;
	int rank;
	union sr_nccl_descr_v4_u u;
} sr_nccl_descr_v4_t;

/* ncclProfilerEventStateArgs_v6_t == _v5_t == _v4_t */
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

/* ncclProfiler_v6_t: v5's functions with v6's descriptor (CE events; they
 * carry no states). */
typedef struct {
	const char *name;
	sr_nccl_result_t (*init)(void **context, uint64_t commId, int *eActivationMask, const char *commName,
				 int nNodes, int nranks, int rank, sr_nccl_logger_t logfn);
	sr_nccl_result_t (*startEvent)(void *context, void **eHandle, sr_nccl_descr_v6_t *eDescr);
	sr_nccl_result_t (*stopEvent)(void *eHandle);
	sr_nccl_result_t (*recordEventState)(void *eHandle, int eState, sr_nccl_state_args_t *eStateArgs);
	sr_nccl_result_t (*finalize)(void *context);
} sr_nccl_profiler_v6_t;

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
SR_NCCL_ASSERT(offsetof(union sr_nccl_descr_u, ceColl.seqNumber) == 0, "ceColl.seqNumber");
SR_NCCL_ASSERT(offsetof(union sr_nccl_descr_u, ceColl.func) == 8, "ceColl.func");
SR_NCCL_ASSERT(offsetof(union sr_nccl_descr_u, ceColl.count) == 32, "ceColl.count");
SR_NCCL_ASSERT(offsetof(union sr_nccl_descr_u, ceColl.root) == 40, "ceColl.root");
SR_NCCL_ASSERT(offsetof(union sr_nccl_descr_u, ceColl.datatype) == 48, "ceColl.datatype");
SR_NCCL_ASSERT(offsetof(union sr_nccl_descr_u, ceColl.syncStrategy) == 56, "ceColl.syncStrategy");
SR_NCCL_ASSERT(offsetof(union sr_nccl_descr_u, ceColl.intraBatchSync) == 64, "ceColl.intraBatchSync");
SR_NCCL_ASSERT(offsetof(union sr_nccl_descr_u, ceColl.batchSize) == 68, "ceColl.batchSize");
SR_NCCL_ASSERT(offsetof(union sr_nccl_descr_u, ceColl.ceSeqNum) == 76, "ceColl.ceSeqNum");
SR_NCCL_ASSERT(offsetof(union sr_nccl_descr_u, ceColl.stream) == 80, "ceColl.stream");
SR_NCCL_ASSERT(offsetof(union sr_nccl_descr_u, ceCollSync.nRanks) == 4, "ceCollSync.nRanks");
SR_NCCL_ASSERT(offsetof(union sr_nccl_descr_u, ceCollBatch.totalBytes) == 8, "ceCollBatch.totalBytes");
SR_NCCL_ASSERT(offsetof(union sr_nccl_descr_u, ceCollBatch.useIntraSync) == 16, "ceCollBatch.useIntraSync");
SR_NCCL_ASSERT(sizeof(union sr_nccl_descr_u) == 88, "union size: coll and ceColl, 88 bytes each");
SR_NCCL_ASSERT(sizeof(sr_nccl_descr_v5_t) == 112, "v5 / v6 descriptor size");
SR_NCCL_ASSERT(sizeof(sr_nccl_descr_v4_t) == 104, "v4 descriptor size");
/* v4 read through the v5 view: each field the plugin reads at the same offset. */
#define SR_NCCL_SAME(f)                                                                                               \
	SR_NCCL_ASSERT(offsetof(union sr_nccl_descr_u, f) == offsetof(union sr_nccl_descr_v4_u, f) &&                 \
			       sizeof(((union sr_nccl_descr_u *)0)->f) == sizeof(((union sr_nccl_descr_v4_u *)0)->f), \
		       "v4 " #f)
SR_NCCL_SAME(coll.seqNumber);
SR_NCCL_SAME(coll.func);
SR_NCCL_SAME(coll.count);
SR_NCCL_SAME(coll.root);
SR_NCCL_SAME(coll.datatype);
SR_NCCL_SAME(coll.nChannels);
SR_NCCL_SAME(coll.algo);
SR_NCCL_SAME(coll.proto);
SR_NCCL_SAME(p2p.func);
SR_NCCL_SAME(p2p.datatype);
SR_NCCL_SAME(p2p.count);
SR_NCCL_SAME(p2p.peer);
SR_NCCL_SAME(p2p.nChannels);
SR_NCCL_SAME(kernelCh.channelId);
SR_NCCL_SAME(kernelCh.pTimer);
#undef SR_NCCL_SAME
#undef SR_NCCL_ASSERT
#endif

#endif /* SLOWRANK_NCCL_PROFILER_H */
