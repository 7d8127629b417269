//go:build ignore

/*
 * test_nccl_abi.c - cupti/nccl_profiler.h against NCCL's own profiler
 * headers of a release tag, at compile time: every descriptor field slowrank
 * declares (offset, size, type), the state-argument union, the function
 * tables (member offsets and the types of init/stopEvent/finalize; the
 * shapes of startEvent/recordEventState), the event types, states and mask
 * bits. A drift fails the build; the program only says what it compared.
 *
 * Built once per vendored tree (third_party/nccl/<tag>, `make
 * cupti-nccl-abi`, part of cupti-test) and against any NVIDIA/nccl checkout
 * (`make cupti-nccl-abi-src NCCL_SRC=...`). Include path: this directory's
 * testdata/nccl_abi shims first (<cstdint>, os.h: NCCL writes these headers
 * for C++), then <tree>/src/include. Which versions the tree declares is
 * read from the headers' include guards.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "nccl_profiler.h"

/* What nccl.h / nccl_common.h declare and the plugin headers use. Both are
 * int-sized enums upstream (ncclResult_t; ncclDebugLogLevel, the logger's
 * first argument); taking slowrank's types here makes the function-pointer
 * comparisons below check everything else of each signature. */
typedef sr_nccl_result_t ncclResult_t;
typedef sr_nccl_logger_t ncclDebugLogger_t;

#include "plugin/nccl_profiler.h"

#ifndef SR_NCCL_TAG
#define SR_NCCL_TAG "(unnamed tree)"
#endif

#define TYPEOF(t, f) __typeof__(((t *)0)->f)
#define SAME_TYPE(a, b) __builtin_types_compatible_p(a, b)

/* One field: our (type, path) against NCCL's (type, path). */
#define FIELD(ot, of, nt, nf)                                                         \
	_Static_assert(offsetof(ot, of) == offsetof(nt, nf), #ot "." #of ": offset"); \
	_Static_assert(SAME_TYPE(TYPEOF(ot, of), TYPEOF(nt, nf)), #ot "." #of ": type")
/* Enumerators of two enums: compared as ints (no -Wenum-compare). */
#define SAME_VALUE(ours, theirs) _Static_assert((int)(ours) == (int)(theirs), #theirs)
#define SIZE(ot, nt)                                                              \
	_Static_assert(sizeof(ot) == sizeof(nt), #ot ": size differs from " #nt); \
	_Static_assert(_Alignof(ot) == _Alignof(nt), #ot ": alignment differs from " #nt)

static int checked;
#define NOTE(what) (printf("  %s: %s\n", SR_NCCL_TAG, what), checked++)

/* ---- event types, mask bits and states (nccl_profiler.h) ---- */

SAME_VALUE(SR_NCCL_PROFILE_GROUP, ncclProfileGroup);
SAME_VALUE(SR_NCCL_PROFILE_COLL, ncclProfileColl);
SAME_VALUE(SR_NCCL_PROFILE_P2P, ncclProfileP2p);
SAME_VALUE(SR_NCCL_PROFILE_PROXY_OP, ncclProfileProxyOp);
SAME_VALUE(SR_NCCL_PROFILE_PROXY_STEP, ncclProfileProxyStep);
SAME_VALUE(SR_NCCL_PROFILE_PROXY_CTRL, ncclProfileProxyCtrl);
SAME_VALUE(SR_NCCL_PROFILE_KERNEL_CH, ncclProfileKernelCh);
SAME_VALUE(SR_NCCL_PROFILE_NET_PLUGIN, ncclProfileNetPlugin);
SAME_VALUE(SR_NCCL_STATE_KERNEL_CH_STOP, ncclProfilerKernelChStop);
/* recordEventState takes the state enum where slowrank takes an int. */
_Static_assert(sizeof(ncclProfilerEventState_t) == sizeof(int), "ncclProfilerEventState_t is not int-sized");
/* The mask bits slowrank stores (slowrank_abi.h mirrors them for the agent). */
_Static_assert(SR_NCCL_PROFILE_COLL == (1 << 1) && SR_NCCL_PROFILE_P2P == (1 << 2) &&
		       SR_NCCL_PROFILE_KERNEL_CH == (1 << 6),
	       "mask bits");

/* ---- v4 (profiler_v4.h) ---- */

#define D4(f) FIELD(sr_nccl_descr_v4_t, u.f, ncclProfilerEventDescr_v4_t, f)
SIZE(sr_nccl_descr_v4_t, ncclProfilerEventDescr_v4_t);
FIELD(sr_nccl_descr_v4_t, type, ncclProfilerEventDescr_v4_t, type);
FIELD(sr_nccl_descr_v4_t, parentObj, ncclProfilerEventDescr_v4_t, parentObj);
FIELD(sr_nccl_descr_v4_t, rank, ncclProfilerEventDescr_v4_t, rank);
D4(coll.seqNumber);
D4(coll.func);
D4(coll.sendBuff);
D4(coll.recvBuff);
D4(coll.count);
D4(coll.root);
D4(coll.datatype);
D4(coll.nChannels);
D4(coll.nWarps);
D4(coll.algo);
D4(coll.proto);
D4(p2p.func);
D4(p2p.buff);
D4(p2p.datatype);
D4(p2p.count);
D4(p2p.peer);
D4(p2p.nChannels);
D4(proxyOp.pid);
D4(proxyOp.channelId);
D4(proxyOp.peer);
D4(proxyOp.nSteps);
D4(proxyOp.chunkSize);
D4(proxyOp.isSend);
D4(proxyStep.step);
D4(kernelCh.channelId);
D4(kernelCh.pTimer);
D4(netPlugin.id);
D4(netPlugin.data);

#define A4(f) FIELD(sr_nccl_state_args_t, f, ncclProfilerEventStateArgs_v4_t, f)
SIZE(sr_nccl_state_args_t, ncclProfilerEventStateArgs_v4_t);
A4(proxyStep.transSize);
A4(proxyCtrl.appendedProxyOps);
A4(netPlugin.data);
A4(kernelCh.pTimer);

#define T4(f) _Static_assert(offsetof(sr_nccl_profiler_v4_t, f) == offsetof(ncclProfiler_v4_t, f), "v4 table " #f)
SIZE(sr_nccl_profiler_v4_t, ncclProfiler_v4_t);
T4(name);
T4(init);
T4(startEvent);
T4(stopEvent);
T4(recordEventState);
T4(finalize);
FIELD(sr_nccl_profiler_v4_t, name, ncclProfiler_v4_t, name);
/* init(ctx, mask, commName, commHash, nNodes, nranks, rank, logfn): v5 reorders it. */
FIELD(sr_nccl_profiler_v4_t, init, ncclProfiler_v4_t, init);
FIELD(sr_nccl_profiler_v4_t, stopEvent, ncclProfiler_v4_t, stopEvent);
FIELD(sr_nccl_profiler_v4_t, finalize, ncclProfiler_v4_t, finalize);
_Static_assert(SAME_TYPE(TYPEOF(ncclProfiler_v4_t, startEvent),
			 sr_nccl_result_t (*)(void *, void **, ncclProfilerEventDescr_v4_t *)),
	       "v4 startEvent(context, eHandle*, eDescr*)");
_Static_assert(SAME_TYPE(TYPEOF(ncclProfiler_v4_t, recordEventState),
			 sr_nccl_result_t (*)(void *, ncclProfilerEventState_v4_t, ncclProfilerEventStateArgs_v4_t *)),
	       "v4 recordEventState(eHandle, eState, eStateArgs*)");

/* ---- v5 (profiler_v5.h, 2.28 on) ---- */

#ifdef PROFILER_V5_H_
#define HAVE_V5 1
SAME_VALUE(SR_NCCL_PROFILE_GROUP_API, ncclProfileGroupApi);
SAME_VALUE(SR_NCCL_PROFILE_COLL_API, ncclProfileCollApi);
SAME_VALUE(SR_NCCL_PROFILE_P2P_API, ncclProfileP2pApi);
SAME_VALUE(SR_NCCL_PROFILE_KERNEL_LAUNCH, ncclProfileKernelLaunch);
SAME_VALUE(SR_NCCL_STATE_GROUP_START_API_STOP, ncclProfilerGroupStartApiStop);
SAME_VALUE(SR_NCCL_STATE_GROUP_END_API_START, ncclProfilerGroupEndApiStart);

/* v5's descriptor fields; v6 has them too. */
#define V5_FIELDS(X)              \
	X(groupApi.graphCaptured) \
	X(groupApi.groupDepth)    \
	X(collApi.func)           \
	X(collApi.count)          \
	X(collApi.datatype)       \
	X(collApi.root)           \
	X(collApi.stream)         \
	X(collApi.graphCaptured)  \
	X(p2pApi.func)            \
	X(p2pApi.count)           \
	X(p2pApi.datatype)        \
	X(p2pApi.stream)          \
	X(p2pApi.graphCaptured)   \
	X(kernelLaunch.stream)    \
	X(coll.seqNumber)         \
	X(coll.func)              \
	X(coll.sendBuff)          \
	X(coll.recvBuff)          \
	X(coll.count)             \
	X(coll.root)              \
	X(coll.datatype)          \
	X(coll.nChannels)         \
	X(coll.nWarps)            \
	X(coll.algo)              \
	X(coll.proto)             \
	X(coll.parentGroup)       \
	X(p2p.func)               \
	X(p2p.buff)               \
	X(p2p.datatype)           \
	X(p2p.count)              \
	X(p2p.peer)               \
	X(p2p.nChannels)          \
	X(p2p.parentGroup)        \
	X(proxyOp.pid)            \
	X(proxyOp.channelId)      \
	X(proxyOp.peer)           \
	X(proxyOp.nSteps)         \
	X(proxyOp.chunkSize)      \
	X(proxyOp.isSend)         \
	X(proxyStep.step)         \
	X(kernelCh.channelId)     \
	X(kernelCh.pTimer)        \
	X(netPlugin.id)           \
	X(netPlugin.data)

#define D5(f) FIELD(sr_nccl_descr_v5_t, u.f, ncclProfilerEventDescr_v5_t, f);
SIZE(sr_nccl_descr_v5_t, ncclProfilerEventDescr_v5_t);
FIELD(sr_nccl_descr_v5_t, type, ncclProfilerEventDescr_v5_t, type);
FIELD(sr_nccl_descr_v5_t, parentObj, ncclProfilerEventDescr_v5_t, parentObj);
FIELD(sr_nccl_descr_v5_t, rank, ncclProfilerEventDescr_v5_t, rank);
V5_FIELDS(D5)

#define A5(f) FIELD(sr_nccl_state_args_t, f, ncclProfilerEventStateArgs_v5_t, f)
SIZE(sr_nccl_state_args_t, ncclProfilerEventStateArgs_v5_t);
A5(proxyStep.transSize);
A5(proxyCtrl.appendedProxyOps);
A5(netPlugin.data);
A5(kernelCh.pTimer);

#define T5(f) _Static_assert(offsetof(sr_nccl_profiler_v5_t, f) == offsetof(ncclProfiler_v5_t, f), "v5 table " #f)
SIZE(sr_nccl_profiler_v5_t, ncclProfiler_v5_t);
T5(name);
T5(init);
T5(startEvent);
T5(stopEvent);
T5(recordEventState);
T5(finalize);
FIELD(sr_nccl_profiler_v5_t, name, ncclProfiler_v5_t, name);
/* init(ctx, commId, mask, commName, nNodes, nranks, rank, logfn) */
FIELD(sr_nccl_profiler_v5_t, init, ncclProfiler_v5_t, init);
FIELD(sr_nccl_profiler_v5_t, stopEvent, ncclProfiler_v5_t, stopEvent);
FIELD(sr_nccl_profiler_v5_t, finalize, ncclProfiler_v5_t, finalize);
_Static_assert(SAME_TYPE(TYPEOF(ncclProfiler_v5_t, startEvent),
			 sr_nccl_result_t (*)(void *, void **, ncclProfilerEventDescr_v5_t *)),
	       "v5 startEvent(context, eHandle*, eDescr*)");
_Static_assert(SAME_TYPE(TYPEOF(ncclProfiler_v5_t, recordEventState),
			 sr_nccl_result_t (*)(void *, ncclProfilerEventState_v5_t, ncclProfilerEventStateArgs_v5_t *)),
	       "v5 recordEventState(eHandle, eState, eStateArgs*)");
#else
#define HAVE_V5 0
#endif

/* ---- v6 (profiler_v6.h, 2.29 on; not vendored: make cupti-nccl-abi-src) ---- */

#ifdef PROFILER_V6_H_
#define HAVE_V6 1
SAME_VALUE(SR_NCCL_PROFILE_CE_COLL, ncclProfileCeColl);
SAME_VALUE(SR_NCCL_PROFILE_CE_SYNC, ncclProfileCeSync);
SAME_VALUE(SR_NCCL_PROFILE_CE_BATCH, ncclProfileCeBatch);

#define D6(f) FIELD(sr_nccl_descr_v6_t, u.f, ncclProfilerEventDescr_v6_t, f);
SIZE(sr_nccl_descr_v6_t, ncclProfilerEventDescr_v6_t);
FIELD(sr_nccl_descr_v6_t, type, ncclProfilerEventDescr_v6_t, type);
FIELD(sr_nccl_descr_v6_t, parentObj, ncclProfilerEventDescr_v6_t, parentObj);
FIELD(sr_nccl_descr_v6_t, rank, ncclProfilerEventDescr_v6_t, rank);
V5_FIELDS(D6)
D6(ceColl.seqNumber)
D6(ceColl.func)
D6(ceColl.sendBuff)
D6(ceColl.recvBuff)
D6(ceColl.count)
D6(ceColl.root)
D6(ceColl.datatype)
D6(ceColl.syncStrategy)
D6(ceColl.intraBatchSync)
D6(ceColl.batchSize)
D6(ceColl.numBatches)
D6(ceColl.ceSeqNum)
D6(ceColl.stream)
D6(ceCollSync.isComplete)
D6(ceCollSync.nRanks)
D6(ceCollBatch.numOps)
D6(ceCollBatch.totalBytes)
D6(ceCollBatch.useIntraSync)

#define A6(f) FIELD(sr_nccl_state_args_t, f, ncclProfilerEventStateArgs_v6_t, f)
SIZE(sr_nccl_state_args_t, ncclProfilerEventStateArgs_v6_t);
A6(proxyStep.transSize);
A6(proxyCtrl.appendedProxyOps);
A6(netPlugin.data);
A6(kernelCh.pTimer);

#define T6(f) _Static_assert(offsetof(sr_nccl_profiler_v6_t, f) == offsetof(ncclProfiler_v6_t, f), "v6 table " #f)
SIZE(sr_nccl_profiler_v6_t, ncclProfiler_v6_t);
T6(name);
T6(init);
T6(startEvent);
T6(stopEvent);
T6(recordEventState);
T6(finalize);
FIELD(sr_nccl_profiler_v6_t, name, ncclProfiler_v6_t, name);
FIELD(sr_nccl_profiler_v6_t, init, ncclProfiler_v6_t, init);
FIELD(sr_nccl_profiler_v6_t, stopEvent, ncclProfiler_v6_t, stopEvent);
FIELD(sr_nccl_profiler_v6_t, finalize, ncclProfiler_v6_t, finalize);
_Static_assert(SAME_TYPE(TYPEOF(ncclProfiler_v6_t, startEvent),
			 sr_nccl_result_t (*)(void *, void **, ncclProfilerEventDescr_v6_t *)),
	       "v6 startEvent(context, eHandle*, eDescr*)");
_Static_assert(SAME_TYPE(TYPEOF(ncclProfiler_v6_t, recordEventState),
			 sr_nccl_result_t (*)(void *, ncclProfilerEventState_v6_t, ncclProfilerEventStateArgs_v6_t *)),
	       "v6 recordEventState(eHandle, eState, eStateArgs*)");
#else
#define HAVE_V6 0
#endif

int main(void)
{
	NOTE("v4: ncclProfilerEventDescr_v4_t, ncclProfilerEventStateArgs_v4_t, ncclProfiler_v4_t");
	if (HAVE_V5)
		NOTE("v5: ncclProfilerEventDescr_v5_t, ncclProfilerEventStateArgs_v5_t, ncclProfiler_v5_t");
	if (HAVE_V6)
		NOTE("v6: ncclProfilerEventDescr_v6_t, ncclProfilerEventStateArgs_v6_t, ncclProfiler_v6_t");
	NOTE("event types, states, mask bits");
	printf("test_nccl_abi %s: ok (%d layouts matched at compile time)\n", SR_NCCL_TAG, checked);
	return 0;
}
