//go:build ignore

/*
 * slowrank_abi.h - the batch ABI between libslowrank_cupti.so and the agent.
 *
 * This header is the single definition of every structure that crosses the
 * boundary between the injection library (C), the BPF program that copies
 * batches into the ring buffer, and the Go decoder (package cupti). It does
 * not depend on any CUDA or CUPTI header: the layout is fixed, little-endian
 * (x86-64 and aarch64), naturally aligned, and versioned by
 * SLOWRANK_ABI_VERSION. Sizes and offsets are pinned by _Static_assert below
 * and by the Go tests (cupti/abi_test.go); regenerate the Go mirror with
 * `make cupti-generate` after any change.
 *
 * Rules for changing it:
 *   - Appending fields to a record (growing its `size`) keeps the version:
 *     decoders read the prefix they know and skip the rest.
 *   - A new record kind keeps the version: decoders skip unknown kinds by
 *     `size` and count them.
 *   - Anything else (moving, resizing or re-typing a field) bumps
 *     SLOWRANK_ABI_VERSION.
 */
#ifndef SLOWRANK_ABI_H
#define SLOWRANK_ABI_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The definitions below are tables aligned by hand (each field with its
 * offset and meaning in columns): clang-format keeps out of them. */
/* clang-format off */

/* ---------------------------------------------------------------------- */
/* Batches                                                                 */
/* ---------------------------------------------------------------------- */

/* "SRCB" read as a little-endian u32. */
#define SLOWRANK_BATCH_MAGIC 0x42435253u
#define SLOWRANK_ABI_VERSION 1
/* Largest batch handed to slowrank_cupti_emit, header included. */
#define SLOWRANK_BATCH_MAX 16384
/* Every record starts 8-byte aligned and its size is a multiple of 8. */
#define SLOWRANK_RECORD_ALIGN 8
/* Smallest legal record (a bare record header padded to the alignment). */
#define SLOWRANK_RECORD_MIN 8
/* Bound on the bytes of a kernel name carried by a name definition. */
#define SLOWRANK_NAME_MAX 512

/* Batch header flags. */
#define SLOWRANK_BATCH_F_EPOCH_START (1u << 0) /* first batch of an attach epoch: names are re-sent */
#define SLOWRANK_BATCH_F_FINAL       (1u << 1) /* last batch of the process (exit flush) */

/* Clock of the record timestamps. Record timestamps are always CLOCK_MONOTONIC
 * nanoseconds; clock_source says how the library obtained them. */
#define SLOWRANK_CLOCK_MONOTONIC_CALLBACK 0 /* cuptiActivityRegisterTimestampCallback returned CLOCK_MONOTONIC */
#define SLOWRANK_CLOCK_CALIBRATED         1 /* CUPTI's clock + clock_offset_ns (already applied) */
#define SLOWRANK_CLOCK_UNKNOWN            2 /* no calibration yet: timestamps are CUPTI's raw clock */

struct slowrank_batch_header {
	uint32_t magic;            /*  0 SLOWRANK_BATCH_MAGIC */
	uint16_t version;          /*  4 SLOWRANK_ABI_VERSION */
	uint16_t flags;            /*  6 SLOWRANK_BATCH_F_* */
	uint32_t pid;              /*  8 getpid() of the training process (its own pid namespace) */
	uint32_t count;            /* 12 number of records that follow */
	uint64_t seq;              /* 16 batch sequence number, starts at 1, +1 per emitted batch (completion order) */
	uint64_t cupti_dropped;    /* 24 cumulative records CUPTI reported dropped (no buffer / buffer full) */
	uint64_t lib_dropped;      /* 32 cumulative records the library saw but did not emit */
	uint32_t total_len;        /* 40 bytes of this batch, header included (<= SLOWRANK_BATCH_MAX) */
	uint16_t header_size;      /* 44 sizeof(struct slowrank_batch_header); records start here */
	uint16_t clock_source;     /* 46 SLOWRANK_CLOCK_* */
	int64_t  clock_offset_ns;  /* 48 monotonic = cupti + offset (already applied to the records) */
	uint32_t clock_bracket_ns; /* 56 width of the tightest calibration bracket (0 for the callback) */
	uint32_t generation;       /* 60 control-block generation the library was applying */
};

/* Every record starts with this. `size` covers the whole record including
 * this header and its padding; it is a multiple of SLOWRANK_RECORD_ALIGN. */
struct slowrank_record_header {
	uint16_t kind; /* SLOWRANK_REC_* */
	uint16_t size;
};

#define SLOWRANK_REC_KERNEL     1
#define SLOWRANK_REC_MEMCPY     2
#define SLOWRANK_REC_MEMSET     3
#define SLOWRANK_REC_NAME       4
#define SLOWRANK_REC_STATS      5
#define SLOWRANK_REC_TRANSITION 6
#define SLOWRANK_REC_NCCL_COMM   7 /* NCCL profiler plugin: a communicator (see NCCL records below) */
#define SLOWRANK_REC_NCCL_COLL   8 /* NCCL profiler plugin: one collective or p2p operation, host side */
#define SLOWRANK_REC_NCCL_KERNEL 9 /* NCCL profiler plugin: GPU start/end of one operation's kernel channels */

/* Kernel classes, decided once per distinct name when it is interned. */
#define SLOWRANK_CLASS_OTHER         0
#define SLOWRANK_CLASS_COMMUNICATION 1 /* nccl*Kernel*, ncclDevKernel*, nvshmem */
#define SLOWRANK_CLASS_ATTENTION     2 /* flash, fmha, sdpa, attention */
#define SLOWRANK_CLASS_GEMM          3 /* gemm, cutlass, cublas, xmma, nvjet */
#define SLOWRANK_CLASS_MOE           4 /* grouped gemm, moe, all-to-all, token permute */
#define SLOWRANK_CLASS_COPY          5 /* copy kernels */
#define SLOWRANK_CLASS_COUNT         6

/* Kernel record flags. */
#define SLOWRANK_KERNEL_F_SERIAL (1u << 0) /* came from CUPTI_ACTIVITY_KIND_KERNEL (serialised mode) */

struct slowrank_kernel_record {
	uint16_t kind;        /*  0 SLOWRANK_REC_KERNEL */
	uint16_t size;        /*  2 */
	uint8_t  kclass;      /*  4 SLOWRANK_CLASS_* */
	uint8_t  flags;       /*  5 SLOWRANK_KERNEL_F_* */
	uint16_t reserved;    /*  6 */
	uint64_t start_ns;    /*  8 CLOCK_MONOTONIC */
	uint64_t end_ns;      /* 16 CLOCK_MONOTONIC */
	uint32_t device;      /* 24 */
	uint32_t context;     /* 28 */
	uint32_t stream;      /* 32 */
	uint32_t correlation; /* 36 */
	int32_t  grid_x;      /* 40 */
	int32_t  grid_y;      /* 44 */
	int32_t  grid_z;      /* 48 */
	int32_t  block_x;     /* 52 */
	int32_t  block_y;     /* 56 */
	int32_t  block_z;     /* 60 */
	uint32_t name_id;     /* 64 0 = no name */
	uint32_t reserved2;   /* 68 */
};

/* Memcpy and memset share one layout. */
struct slowrank_copy_record {
	uint16_t kind;        /*  0 SLOWRANK_REC_MEMCPY or SLOWRANK_REC_MEMSET */
	uint16_t size;        /*  2 */
	uint8_t  copy_kind;   /*  4 CUpti_ActivityMemcpyKind (memcpy); 0 for memset */
	uint8_t  src_kind;    /*  5 CUpti_ActivityMemoryKind (memcpy); memset: memory kind */
	uint8_t  dst_kind;    /*  6 CUpti_ActivityMemoryKind (memcpy); 0 for memset */
	uint8_t  flags;       /*  7 CUpti_ActivityFlag low byte (async bit) */
	uint64_t start_ns;    /*  8 CLOCK_MONOTONIC */
	uint64_t end_ns;      /* 16 CLOCK_MONOTONIC */
	uint64_t bytes;       /* 24 */
	uint32_t device;      /* 32 */
	uint32_t context;     /* 36 */
	uint32_t stream;      /* 40 */
	uint32_t correlation; /* 44 */
};

/* Name definition: sent once per name per process and attach epoch, always
 * in the same batch as (and before) the first record that uses it. */
#define SLOWRANK_NAME_F_TRUNCATED (1u << 0)

struct slowrank_name_record {
	uint16_t kind;     /*  0 SLOWRANK_REC_NAME */
	uint16_t size;     /*  2 = round_up(16 + len, 8) */
	uint16_t len;      /*  4 bytes that follow (<= SLOWRANK_NAME_MAX), no NUL */
	uint8_t  kclass;   /*  6 SLOWRANK_CLASS_* */
	uint8_t  flags;    /*  7 SLOWRANK_NAME_F_* */
	uint32_t name_id;  /*  8 > 0, unique per process, never reused */
	uint32_t full_len; /* 12 length of the untruncated name */
	/* char bytes[len]; then zero padding */
};

/* Counters: cumulative since the process started. */
#define SLOWRANK_STAT_RECORDS_SEEN        0  /* CUPTI records walked */
#define SLOWRANK_STAT_KERNELS             1
#define SLOWRANK_STAT_MEMCPYS             2
#define SLOWRANK_STAT_MEMSETS             3
#define SLOWRANK_STAT_UNKNOWN_KINDS       4  /* CUPTI records of kinds the library does not convert */
#define SLOWRANK_STAT_BAD_RECORDS         5  /* truncated, or ending before they start */
#define SLOWRANK_STAT_NAMES               6  /* distinct names interned */
#define SLOWRANK_STAT_NAMES_OVERFLOW      7  /* kernels whose name did not fit the table (name_id 0) */
#define SLOWRANK_STAT_BUFFERS_REQUESTED   8
#define SLOWRANK_STAT_BUFFERS_REFUSED     9  /* pool exhausted: CUPTI got no buffer and drops */
#define SLOWRANK_STAT_BUFFERS_COMPLETED   10
#define SLOWRANK_STAT_BATCHES             11
#define SLOWRANK_STAT_BATCH_BYTES         12
#define SLOWRANK_STAT_FLUSHES             13
#define SLOWRANK_STAT_ENABLES             14 /* off -> on transitions */
#define SLOWRANK_STAT_ATTACHES            15 /* semaphore 0 -> non-zero */
#define SLOWRANK_STAT_CUPTI_ERRORS        16
#define SLOWRANK_STAT_ON_NS               17 /* total time with activity kinds enabled */
#define SLOWRANK_STAT_DISCARDED_DETACHED  18 /* records completed while no agent was attached */
#define SLOWRANK_STAT_YIELDS              19 /* times the library yielded to another CUPTI client */
#define SLOWRANK_STAT_YIELDED_NS          20 /* total time yielded */
#define SLOWRANK_STAT_BUFFERS_ORPHANED    21 /* buffers CUPTI never handed back (another client took them, cuptiFinalize) */
#define SLOWRANK_STAT_FOREIGN_CLOCK       22 /* records dropped: timestamps not on CLOCK_MONOTONIC (another client's clock) */
#define SLOWRANK_STAT_LEASE_EXPIRED       23 /* the agent's configuration aged past its lease: collection off */
#define SLOWRANK_STAT_CONTROL_REJECTED    24 /* configurations refused as out of bounds (period < minimum) */
#define SLOWRANK_STAT_REENABLED           25 /* kinds enabled again after a toggle raced another client's start */
#define SLOWRANK_STAT_SETUPS              26 /* callback (re)registrations */
#define SLOWRANK_STAT_CLOCK_CONVERTED     27 /* records on another clock (CLOCK_REALTIME, TSC) mapped to CLOCK_MONOTONIC */
#define SLOWRANK_STAT_HANDBACKS           28 /* another client's buffer callbacks registered again after the library's (Handback) */
#define SLOWRANK_STAT_FORWARDED           29 /* another client's buffers completed to the library, passed to its own callback */
#define SLOWRANK_STAT_CALLBACKS_TAKEN     30 /* yields where the library's registration may have replaced another client's callbacks and no pair to give back was known */
#define SLOWRANK_STAT_HANDBACK_REJECTED   31 /* pairs from the agent refused (not code of a loaded object, or the library's own) */
/* NCCL profiler plugin (slowrank_nccl.c); 0 in a process whose NCCL never loaded it. */
#define SLOWRANK_STAT_NCCL_EVENTS         32 /* startEvent calls seen */
#define SLOWRANK_STAT_NCCL_COLLS          33 /* NCCL_COLL records queued */
#define SLOWRANK_STAT_NCCL_KERNELS        34 /* NCCL_KERNEL records queued */
#define SLOWRANK_STAT_NCCL_RING_FULL      35 /* records dropped: the in-process ring was full (never blocks) */
#define SLOWRANK_STAT_NCCL_DISCARDED      36 /* records drained while no agent was attached */
#define SLOWRANK_STAT_NCCL_BAD_HANDLES    37 /* calls with a handle or context that is not (or no longer) ours */
#define SLOWRANK_STAT_NCCL_INCOMPLETE     38 /* operations whose kernel channels did not all report before their slot was reused */
#define SLOWRANK_STAT_NCCL_COMMS          39 /* communicators initialised (init calls that succeeded) */
#define SLOWRANK_STAT_NCCL_COMM_OVERFLOW  40 /* communicators not tracked: the table was full */
#define SLOWRANK_STAT_NCCL_CLOCK_SUSPECT  41 /* kernel records whose converted GPU end lies after the host saw it */
#define SLOWRANK_STAT_NCCL_UNKNOWN_EVENTS 42 /* events of types the library does not record (asked for none) */
#define SLOWRANK_STAT_NCCL_API_LOST       43 /* v5/v6 operations recorded without API times: their CollApi/P2pApi slot was reused first */
#define SLOWRANK_STAT_NCCL_CLOCK_CLAMPED  44 /* kernel records whose GPU end lay after host_seen_ns by less than the slack: clamped */
#define SLOWRANK_STAT_INCOMPLETE_RECORDS  45 /* records without timestamps: their work had not run when a forced flush returned them */
#define SLOWRANK_STAT_COUNT               46

struct slowrank_stats_record {
	uint16_t kind;     /* 0 SLOWRANK_REC_STATS */
	uint16_t size;     /* 2 = 8 + 8 * n */
	uint16_t n;        /* 4 number of counters that follow */
	uint16_t reserved; /* 6 */
	/* uint64_t counters[n]; indexed by SLOWRANK_STAT_* */
};

/* Collection transition: activity kinds were enabled (on=1) or disabled at timestamp.
 * Between an "on" and the next "off" of a process, missing kernels mean an idle
 * GPU; outside, device timing is simply absent. */
#define SLOWRANK_REASON_DUTY       0 /* duty cycle phase */
#define SLOWRANK_REASON_ESCALATION 1 /* escalate_until_ns */
#define SLOWRANK_REASON_ATTACH     2 /* agent attached / detached */
#define SLOWRANK_REASON_EXIT       3 /* process exit */
#define SLOWRANK_REASON_ERROR      4 /* CUPTI refused: collection stopped */
#define SLOWRANK_REASON_YIELD      5 /* another CUPTI client (Kineto, nsys) started: hands off */
#define SLOWRANK_REASON_LEASE      6 /* the agent's configuration expired (agent hung) */

struct slowrank_transition_record {
	uint16_t kind;   /*  0 SLOWRANK_REC_TRANSITION */
	uint16_t size;   /*  2 = 16 */
	uint8_t  on;     /*  4 1 = enabled, 0 = disabled */
	uint8_t  reason; /*  5 SLOWRANK_REASON_* */
	uint16_t mode;   /*  6 SLOWRANK_DUTY_* in force */
	uint64_t timestamp; /*  8 CLOCK_MONOTONIC ns */
};

/* ---------------------------------------------------------------------- */
/* NCCL profiler plugin records                                            */
/* ---------------------------------------------------------------------- */

/*
 * The same library is also an NCCL profiler plugin (NCCL_PROFILER_PLUGIN,
 * NCCL >= 2.27: exports ncclProfiler_v6, _v5 and _v4; see
 * slowrank_nccl.c and docs/nccl-profiler-plugin.md). Its records travel in
 * the same batches as the CUPTI records (one uprobe trap per batch). All
 * times are CLOCK_MONOTONIC ns; 0 means absent, never a measurement.
 *
 * Identity: (comm_hash, func, seq) names one collective on every rank of a
 * communicator (NCCL's commHash is equal on all members; seq is NCCL's
 * per-(comm, function) counter). A NCCL_KERNEL record joins its NCCL_COLL
 * record by (comm_hash, rank, func, seq); p2p operations have no seq in
 * NCCL and join by nothing (seq 0, SLOWRANK_NCCL_F_P2P).
 */

/* Operation (the string NCCL passes, mapped once per distinct pointer). */
#define SLOWRANK_NCCL_FUNC_UNKNOWN       0
#define SLOWRANK_NCCL_FUNC_BROADCAST     1
#define SLOWRANK_NCCL_FUNC_REDUCE        2
#define SLOWRANK_NCCL_FUNC_ALLGATHER     3
#define SLOWRANK_NCCL_FUNC_REDUCESCATTER 4
#define SLOWRANK_NCCL_FUNC_ALLREDUCE     5
#define SLOWRANK_NCCL_FUNC_SENDRECV      6
#define SLOWRANK_NCCL_FUNC_SEND          7
#define SLOWRANK_NCCL_FUNC_RECV          8
#define SLOWRANK_NCCL_FUNC_ALLTOALL      9
#define SLOWRANK_NCCL_FUNC_GATHER        10
#define SLOWRANK_NCCL_FUNC_SCATTER       11
#define SLOWRANK_NCCL_FUNC_COUNT         12

/* Datatype (ncclDataType_t's names without the "nccl" prefix). */
#define SLOWRANK_NCCL_DT_UNKNOWN    0
#define SLOWRANK_NCCL_DT_INT8       1
#define SLOWRANK_NCCL_DT_UINT8      2
#define SLOWRANK_NCCL_DT_INT32      3
#define SLOWRANK_NCCL_DT_UINT32     4
#define SLOWRANK_NCCL_DT_INT64      5
#define SLOWRANK_NCCL_DT_UINT64     6
#define SLOWRANK_NCCL_DT_FLOAT16    7
#define SLOWRANK_NCCL_DT_FLOAT32    8
#define SLOWRANK_NCCL_DT_FLOAT64    9
#define SLOWRANK_NCCL_DT_BFLOAT16   10
#define SLOWRANK_NCCL_DT_FLOAT8E4M3 11
#define SLOWRANK_NCCL_DT_FLOAT8E5M2 12
#define SLOWRANK_NCCL_DT_COUNT      13

/* Algorithm and protocol NCCL chose (evidence of the workload, not identity). */
#define SLOWRANK_NCCL_ALGO_UNKNOWN       0
#define SLOWRANK_NCCL_ALGO_TREE          1
#define SLOWRANK_NCCL_ALGO_RING          2
#define SLOWRANK_NCCL_ALGO_COLLNET_DIRECT 3
#define SLOWRANK_NCCL_ALGO_COLLNET_CHAIN 4
#define SLOWRANK_NCCL_ALGO_NVLS          5
#define SLOWRANK_NCCL_ALGO_NVLS_TREE     6
#define SLOWRANK_NCCL_ALGO_PAT           7
#define SLOWRANK_NCCL_ALGO_COUNT         8

#define SLOWRANK_NCCL_PROTO_UNKNOWN 0
#define SLOWRANK_NCCL_PROTO_LL      1
#define SLOWRANK_NCCL_PROTO_LL128   2
#define SLOWRANK_NCCL_PROTO_SIMPLE  3
#define SLOWRANK_NCCL_PROTO_COUNT   4

/* NCCL_COLL and NCCL_KERNEL flags. */
#define SLOWRANK_NCCL_F_P2P        (1u << 0) /* a send/recv (P2p event): root is the peer, seq is 0 */
#define SLOWRANK_NCCL_F_API        (1u << 1) /* api_start_ns/api_end_ns come from the CollApi/P2pApi event (v5, v6) */
#define SLOWRANK_NCCL_F_GRAPH      (1u << 2) /* the API call was captured into a CUDA graph */
#define SLOWRANK_NCCL_F_PARTIAL    (1u << 3) /* NCCL_KERNEL: fewer channels reported than nchannels */
#define SLOWRANK_NCCL_F_CLOCK_SUSPECT (1u << 4) /* NCCL_KERNEL: gpu_end_ns after host_seen_ns + SLOWRANK_NCCL_CLOCK_SLACK_NS (conversion doubtful) */
#define SLOWRANK_NCCL_F_CE         (1u << 5) /* NCCL_COLL: a copy-engine collective (CeColl event, v6): seq is the comm's CE counter, no kernel channels */

/* How far a converted GPU end may lie after host_seen_ns and still count as
 * calibration noise. The plugin converts with the offset that the host's
 * sightings of the latest ends show (their smallest host_seen_ns - GPU end),
 * so ends are never after host_seen_ns, where that offset lies within 10 ms
 * of the CLOCK_MONOTONIC - CLOCK_REALTIME one (the driver keeps %globaltimer
 * near the host's realtime, not to the microsecond: 0.43 ms off on the
 * H200); the slack applies where it does not. Within it the plugin clamps
 * gpu_end_ns to host_seen_ns (the GPU cannot end after the host saw it end; counted,
 * SLOWRANK_STAT_NCCL_CLOCK_CLAMPED); beyond it the record keeps its times
 * and is flagged SLOWRANK_NCCL_F_CLOCK_SUSPECT (a wrong clock is off by
 * seconds or more, not microseconds). */
#define SLOWRANK_NCCL_CLOCK_SLACK_NS 1000000ull

/* NCCL_COMM flags. */
#define SLOWRANK_NCCL_COMM_F_FINALIZED (1u << 0) /* finalize ran: finalize_ns is set */
#define SLOWRANK_NCCL_COMM_F_RESENT    (1u << 1) /* re-sent at an attach epoch, not at init */

/* A communicator: sent at NCCL's init of the plugin for it, again at the
 * start of every attach epoch (an agent that attached later learns it), and
 * at finalize. */
struct slowrank_nccl_comm_record {
	uint16_t kind;        /*  0 SLOWRANK_REC_NCCL_COMM */
	uint16_t size;        /*  2 = 48 */
	uint8_t  version;     /*  4 profiler API NCCL bound: 4, 5 or 6 */
	uint8_t  flags;       /*  5 SLOWRANK_NCCL_COMM_F_* */
	uint16_t comm_id;     /*  6 the library's slot, unique among live comms of the process */
	uint64_t comm_hash;   /*  8 NCCL's commHash (v4) / commId (v5, v6; the same value): equal on all members */
	int32_t  rank;        /* 16 rank in the communicator */
	int32_t  nranks;      /* 20 */
	int32_t  nnodes;      /* 24 */
	uint32_t reserved;    /* 28 */
	uint64_t init_ns;     /* 32 */
	uint64_t finalize_ns; /* 40 0 while alive */
};

/* One collective (Coll event) or send/recv (P2p event), at its stop. The
 * Coll event brackets NCCL's launch of the operation (hostStreamPlanTask):
 * launch_end_ns is "enqueued", not "done"; GPU execution is NCCL_KERNEL.
 * api_*: the CollApi/P2pApi event of the same operation, i.e. the task's
 * append inside the user's ncclAllReduce(...) call (v5, v6; the launch
 * comes after it, in the group end: the call's own implicit one, or
 * ncclGroupEnd for grouped calls). From 2.28 ncclAlltoAll, ncclGather and
 * ncclScatter reach the plugin as their Send/Recv tasks (SLOWRANK_NCCL_F_P2P).
 * A copy-engine collective (v6, SLOWRANK_NCCL_F_CE: AllGather, AlltoAll,
 * Gather, Scatter on one node with symmetric buffers and NCCL's zero-CTA
 * policy) is its CeColl event: the same fields, launch_* bracketing the
 * copy engine's enqueue, seq NCCL's per-comm CE counter (ceSeqNum, not
 * seqNumber[func]), algo, proto and nchannels 0. */
struct slowrank_nccl_coll_record {
	uint16_t kind;            /*  0 SLOWRANK_REC_NCCL_COLL */
	uint16_t size;            /*  2 = 88 */
	uint8_t  func;            /*  4 SLOWRANK_NCCL_FUNC_* */
	uint8_t  datatype;        /*  5 SLOWRANK_NCCL_DT_* */
	uint8_t  algo;            /*  6 SLOWRANK_NCCL_ALGO_* */
	uint8_t  proto;           /*  7 SLOWRANK_NCCL_PROTO_* */
	uint64_t comm_hash;       /*  8 */
	int32_t  rank;            /* 16 */
	int32_t  nranks;          /* 20 */
	uint64_t seq;             /* 24 NCCL's seqNumber for (comm, func); 0 for p2p; the CE counter with F_CE */
	uint64_t count;           /* 32 elements */
	int32_t  root;            /* 40 root (collectives), peer (p2p) */
	uint16_t flags;           /* 44 SLOWRANK_NCCL_F_* */
	uint8_t  nchannels;       /* 46 */
	uint8_t  version;         /* 47 profiler API NCCL bound: 4, 5 or 6 */
	uint64_t api_start_ns;    /* 48 0 without SLOWRANK_NCCL_F_API */
	uint64_t api_end_ns;      /* 56 */
	uint64_t launch_start_ns; /* 64 Coll/P2p/CeColl event start */
	uint64_t launch_end_ns;   /* 72 Coll/P2p/CeColl event stop */
	uint32_t tid;             /* 80 thread that started the Coll/P2p/CeColl event */
	uint32_t comm_id;         /* 84 */
};

/* GPU execution of one operation, from its kernel-channel (KernelCh) events:
 * earliest channel start and latest channel stop, GPU %globaltimer mapped to
 * CLOCK_MONOTONIC with clock_offset_ns (already applied). Sent once every
 * expected channel stopped. Only while kernel-channel events are on (they
 * follow the duty cycle). */
struct slowrank_nccl_kernel_record {
	uint16_t kind;            /*  0 SLOWRANK_REC_NCCL_KERNEL */
	uint16_t size;            /*  2 = 64 */
	uint8_t  func;            /*  4 SLOWRANK_NCCL_FUNC_* */
	uint8_t  flags;           /*  5 SLOWRANK_NCCL_F_* */
	uint8_t  channels;        /*  6 channels that reported a stop */
	uint8_t  nchannels;       /*  7 channels the operation announced */
	uint64_t comm_hash;       /*  8 */
	uint64_t seq;             /* 16 */
	int32_t  rank;            /* 24 */
	uint32_t comm_id;         /* 28 */
	uint64_t gpu_start_ns;    /* 32 */
	uint64_t gpu_end_ns;      /* 40 0 when no channel reported a stop timer */
	uint64_t host_seen_ns;    /* 48 when the plugin saw the last channel stop: gpu_end_ns <= host_seen_ns unless CLOCK_SUSPECT */
	int64_t  clock_offset_ns; /* 56 monotonic = globaltimer + offset */
};

/*
 * NCCL plugin status (library -> agent), exported as slowrank_nccl_status:
 * what `slowrank status` and `doctor` show as the process's capture path.
 * Written by the library only, one aligned store per field.
 */
#define SLOWRANK_NCCL_STATUS_MAGIC   0x4e435253u /* "SRCN" */
#define SLOWRANK_NCCL_STATUS_VERSION 1

#define SLOWRANK_NCCL_MASK_COLL     (1u << 1)  /* ncclProfileColl */
#define SLOWRANK_NCCL_MASK_P2P      (1u << 2)  /* ncclProfileP2p */
#define SLOWRANK_NCCL_MASK_KERNELCH (1u << 6)  /* ncclProfileKernelCh */
#define SLOWRANK_NCCL_MASK_COLLAPI  (1u << 9)  /* ncclProfileCollApi (v5) */
#define SLOWRANK_NCCL_MASK_P2PAPI   (1u << 10) /* ncclProfileP2pApi (v5) */
#define SLOWRANK_NCCL_MASK_CECOLL   (1u << 12) /* ncclProfileCeColl (v6) */

struct slowrank_nccl_status {
	uint32_t magic;       /*  0 SLOWRANK_NCCL_STATUS_MAGIC */
	uint16_t version;     /*  4 SLOWRANK_NCCL_STATUS_VERSION */
	uint16_t size;        /*  6 sizeof(struct slowrank_nccl_status) */
	uint32_t api_version; /*  8 profiler API NCCL bound (0: NCCL never loaded the plugin) */
	uint32_t mask;        /* 12 activation mask last stored into NCCL */
	uint32_t live_comms;  /* 16 */
	uint32_t disabled;    /* 20 1: SLOWRANK_NCCL_DISABLE (init refused) */
	uint64_t inits;       /* 24 */
	uint64_t colls;       /* 32 NCCL_COLL records queued */
	uint64_t dropped;     /* 40 ring full + bad handles + incomplete */
	uint64_t first_init_ns; /* 48 */
	uint64_t reserved;    /* 56 */
};

/* ---------------------------------------------------------------------- */
/* Control block (agent -> library, and library status -> agent)           */
/* ---------------------------------------------------------------------- */

/* "SRCT" read as a little-endian u32. */
#define SLOWRANK_CONTROL_MAGIC   0x54435253u
#define SLOWRANK_CONTROL_VERSION 2

#define SLOWRANK_DUTY_OFF    0 /* never collect */
#define SLOWRANK_DUTY_ALWAYS 1 /* collect while attached */
#define SLOWRANK_DUTY_TIME   2 /* on for on_ms of every period_ms, phase from CLOCK_MONOTONIC + phase_offset_ns */
#define SLOWRANK_DUTY_STEPS  3 /* on while (step % n_steps) < k_steps; the agent writes `step` */

/* Library state, in `state`. */
#define SLOWRANK_STATE_INIT        0 /* InitializeInjection not run yet */
#define SLOWRANK_STATE_IDLE        1 /* no agent attached: nothing enabled, no buffers */
#define SLOWRANK_STATE_ON          2 /* attached, activity kinds enabled */
#define SLOWRANK_STATE_OFF_PHASE   3 /* attached, duty cycle off-phase */
#define SLOWRANK_STATE_UNAVAILABLE 4 /* libcupti could not be loaded */
#define SLOWRANK_STATE_REFUSED     5 /* CUPTI refused (another subscriber, privileges...): retried on next attach */
#define SLOWRANK_STATE_DISABLED    6 /* SLOWRANK_CUPTI_DISABLE=1 */
#define SLOWRANK_STATE_YIELDED     7 /* another CUPTI client is active: the library makes no CUPTI call */

/* agent_flags: what the agent asks of the library besides the duty cycle
 * (written with it, under the seqlock). 0 from an agent that predates them. */
#define SLOWRANK_AGENT_F_NCCL_PLUGIN 0x1u /* it takes the NCCL plugin's records: NCCL's mask may be set */
#define SLOWRANK_AGENT_F_NCCL_NO_KERNELCH 0x2u /* no kernel-channel events in on-phases (their cost is measured apart, or they are off) */

/* status_flags */
#define SLOWRANK_STATUS_CUPTI_LOADED  (1u << 0)
#define SLOWRANK_STATUS_CUPTI_READY   (1u << 1) /* callbacks registered */
#define SLOWRANK_STATUS_TS_CALLBACK   (1u << 2) /* CLOCK_MONOTONIC timestamp callback active */
#define SLOWRANK_STATUS_CALIBRATED    (1u << 3) /* offset calibration in use */
#define SLOWRANK_STATUS_THREAD_ALIVE  (1u << 4)
#define SLOWRANK_STATUS_FORCED_ATTACH (1u << 5) /* SLOWRANK_CUPTI_FORCE_ATTACH=1 (debug) */
#define SLOWRANK_STATUS_LEASE_EXPIRED (1u << 6) /* the agent's configuration expired: collection off */
#define SLOWRANK_STATUS_FOREIGN_SUBSCRIBER (1u << 7) /* at attach, another client held CUPTI's subscriber */
#define SLOWRANK_STATUS_WAITING       (1u << 8) /* attached, waiting for the agent's yield decision */

/*
 * Protocol. The library exports one instance, `slowrank_cupti_control`.
 * The agent finds its address from the library's symbol table and the
 * process's mappings and writes it through /proc/PID/mem:
 *   1. write generation = g+1 (odd: update in progress),
 *   2. write the fields between `mode` and `name_resend`,
 *   3. write generation = g+2 (even).
 * The library polls every <= 50 ms (<= 200 ms while it waits undecided for
 * its first yield decision, see Yield) and applies a configuration only when it
 * reads the same even generation before and after copying the fields.
 * `step` is written alone (aligned u64) at step boundaries, outside that
 * protocol. Fields from `state` to `reserved1` and from `ctl_tid` on are
 * written only by the library.
 *
 * Bounds the library applies to what the agent writes: a TIME period under
 * SLOWRANK_MIN_PERIOD_MS (or 0) means off, not always on; a configuration
 * whose generation has not advanced for SLOWRANK_LEASE_MS (the agent
 * rewrites it at least every SLOWRANK_REFRESH_MS) expires and collection
 * stops until the agent writes again, so a hung agent cannot leave
 * collection on. Blocks never written by an agent (validation modes) have
 * no lease.
 *
 * Yield. Another CUPTI client in the process (Kineto, nsys) shares CUPTI's
 * global activity switches and its one pair of buffer callbacks (CUPTI
 * before 13.3 / driver r610 has one activity client per process). The agent
 * watches libcupti's entry points (uprobes) for calls from any thread but
 * `ctl_tid` (gettid() in the process's PID namespace: the agent maps it to
 * the host's id, which its uprobes see, through NSpid in /proc) and
 * decides: it writes `foreign_since_ns` (time of the other client's first
 * call), `yield`, then advances `cupti_gen`. After an attach the library
 * makes no CUPTI call until `cupti_gen` moves (the agent has looked; the
 * library polls for it every 1 ms for 500 ms, then backs off to 200 ms);
 * while `yield` is non-zero it makes none either, except to enable
 * again the kinds it disabled after foreign_since_ns (they are the other
 * client's now). When `yield` drops to 0 it registers its callbacks and
 * clock again and resumes; buffers it had given CUPTI count as orphaned.
 * At attach the library reports in SLOWRANK_STATUS_FOREIGN_SUBSCRIBER
 * whether another client holds CUPTI's subscriber slot (Kineto holds it
 * from its first profiling session on), for the agent's decision.
 *
 * Hand back. A client that starts between the agent's "no other client"
 * and the library's registration loses its callbacks to it (CUPTI keeps
 * the last pair registered). `handback_addr` points at the library's
 * struct slowrank_cupti_handback (below), where the agent publishes the
 * other client's callbacks as its uprobes saw them; when the library then
 * yields it registers them again (see Handback).
 */
struct slowrank_cupti_control {
	/* fixed at build time */
	uint32_t magic;               /*   0 SLOWRANK_CONTROL_MAGIC */
	uint16_t version;             /*   4 SLOWRANK_CONTROL_VERSION */
	uint16_t size;                /*   6 sizeof(struct slowrank_cupti_control) */
	/* written by the agent */
	uint32_t generation;          /*   8 odd while the agent writes */
	uint32_t mode;                /*  12 SLOWRANK_DUTY_* */
	uint32_t on_ms;               /*  16 TIME: on-phase length */
	uint32_t period_ms;           /*  20 TIME: period */
	uint32_t k_steps;             /*  24 STEPS: on-steps per n */
	uint32_t n_steps;             /*  28 STEPS: period in steps */
	int64_t  phase_offset_ns;     /*  32 TIME: added to CLOCK_MONOTONIC before the modulo */
	uint64_t escalate_until_ns;   /*  40 CLOCK_MONOTONIC; collect (ALWAYS) until then */
	uint32_t name_resend;         /*  48 changing it makes the library re-send every name */
	uint32_t agent_flags;         /*  52 SLOWRANK_AGENT_F_* */
	uint64_t step;                /*  56 STEPS: current step, written by the agent */
	/* written by the library */
	uint32_t state;               /*  64 SLOWRANK_STATE_* */
	uint32_t status_flags;        /*  68 SLOWRANK_STATUS_* */
	uint32_t applied_generation;  /*  72 last generation applied */
	int32_t  last_error;          /*  76 last CUptiResult != CUPTI_SUCCESS (0 = none) */
	uint64_t on_ns_total;         /*  80 cumulative ns with activity kinds enabled */
	uint64_t enables;             /*  88 off -> on transitions */
	uint64_t batches;             /*  96 batches emitted */
	uint64_t records;             /* 104 records emitted */
	uint64_t cupti_dropped;       /* 112 */
	uint64_t lib_dropped;         /* 120 */
	uint64_t heartbeat_ns;        /* 128 CLOCK_MONOTONIC of the control thread's last poll */
	uint32_t cupti_version;       /* 136 cuptiGetVersion() of the loaded libcupti (0 = none) */
	uint32_t reserved1;           /* 140 */
	/* written by the agent, one aligned store each, `cupti_gen` last (see Yield) */
	uint32_t cupti_gen;           /* 144 advanced by the agent with every yield decision */
	uint32_t yield;               /* 148 non-zero: another CUPTI client is active */
	uint64_t foreign_since_ns;    /* 152 CLOCK_MONOTONIC of the other client's first call */
	/* written by the library */
	uint32_t ctl_tid;             /* 160 the library's control thread: its CUPTI calls are its own */
	uint32_t yields;              /* 164 times yielded */
	uint64_t yielded_ns_total;    /* 168 */
	uint64_t buffers_orphaned;    /* 176 */
	uint64_t handback_addr;       /* 184 address of slowrank_cupti_handback in the process (0: none, older library) */
};

/*
 * Handback (agent -> library, counters library -> agent). Found through
 * slowrank_cupti_control.handback_addr; absent (0) in libraries before it,
 * and an agent that never writes it leaves the library as it was: a client
 * whose callbacks the library's registration replaced gets no records
 * until it registers again (counted, SLOWRANK_STAT_CALLBACKS_TAKEN).
 *
 * The agent writes, for calls into libcupti from any thread but `ctl_tid`
 * (its uprobes' arguments, CLOCK_MONOTONIC entry times), with a seqlock:
 * seq+1 (odd), the fields from `flags` to `kinds`, seq+2; then it advances
 * cupti_gen in the control block (with or without a new yield decision):
 *   request_fn, complete_fn, pair_ns: the arguments and time of the last
 *     cuptiActivityRegisterCallbacks call (SLOWRANK_HANDBACK_F_PAIR);
 *   timestamp_fn, timestamp_ns: the same for
 *     cuptiActivityRegisterTimestampCallback (SLOWRANK_HANDBACK_F_CLOCK);
 *   kinds: bit k set while the other client has called cuptiActivityEnable(k)
 *     (k < 64) and not cuptiActivityDisable(k) or cuptiFinalize since
 *     (SLOWRANK_HANDBACK_F_KINDS).
 * The library, while yielded to a session that began (foreign_since_ns)
 * before its own last cuptiActivityRegisterCallbacks returned, registers
 * the pair again when pair_ns >= foreign_since_ns and pair_ns is not after
 * that return (the other client's registration may have come first), the
 * clock likewise, and enables again those of its kinds (of `kinds` when
 * given) that it disabled after foreign_since_ns. A pair is used only if
 * both addresses lie in executable segments of objects loaded in the
 * process and differ from the library's own (own_request, own_complete).
 * Buffers of the other client that CUPTI completed to the library's
 * callbacks meanwhile are passed to its completion callback.
 */
#define SLOWRANK_HANDBACK_MAGIC   0x42485253u /* "SRHB" */
#define SLOWRANK_HANDBACK_VERSION 1

#define SLOWRANK_HANDBACK_F_PAIR  (1u << 0) /* request_fn, complete_fn, pair_ns are set */
#define SLOWRANK_HANDBACK_F_CLOCK (1u << 1) /* timestamp_fn, timestamp_ns are set */
#define SLOWRANK_HANDBACK_F_KINDS (1u << 2) /* kinds is kept by the agent */

struct slowrank_cupti_handback {
	/* fixed at build time */
	uint32_t magic;            /*   0 SLOWRANK_HANDBACK_MAGIC */
	uint16_t version;          /*   4 SLOWRANK_HANDBACK_VERSION */
	uint16_t size;             /*   6 sizeof(struct slowrank_cupti_handback) */
	/* written by the library at start: its own callbacks */
	uint64_t own_request;      /*   8 */
	uint64_t own_complete;     /*  16 */
	uint64_t own_timestamp;    /*  24 */
	/* written by the agent (seqlock on seq) */
	uint32_t seq;              /*  32 odd while the agent writes */
	uint32_t flags;            /*  36 SLOWRANK_HANDBACK_F_* */
	uint64_t request_fn;       /*  40 */
	uint64_t complete_fn;      /*  48 */
	uint64_t pair_ns;          /*  56 CLOCK_MONOTONIC */
	uint64_t timestamp_fn;     /*  64 */
	uint64_t timestamp_ns;     /*  72 CLOCK_MONOTONIC */
	uint64_t kinds;            /*  80 bit per CUpti_ActivityKind < 64 */
	/* written by the library */
	uint64_t handbacks;        /*  88 pairs registered again (SLOWRANK_STAT_HANDBACKS) */
	uint64_t clock_handbacks;  /*  96 timestamp callbacks registered again */
	uint64_t forwarded;        /* 104 SLOWRANK_STAT_FORWARDED */
	uint64_t taken;            /* 112 SLOWRANK_STAT_CALLBACKS_TAKEN */
	uint64_t rejected;         /* 120 SLOWRANK_STAT_HANDBACK_REJECTED */
	uint64_t applied_pair_ns;  /* 128 pair_ns of the last pair registered again */
	uint64_t reserved;         /* 136 */
};

#define SLOWRANK_MIN_PERIOD_MS 100
#define SLOWRANK_LEASE_MS      60000
#define SLOWRANK_REFRESH_MS    10000

/* Defaults when the agent never writes the block: 200 ms of every 20 s. */
#define SLOWRANK_DEFAULT_MODE      SLOWRANK_DUTY_TIME
#define SLOWRANK_DEFAULT_ON_MS     200
#define SLOWRANK_DEFAULT_PERIOD_MS 20000

/* ---------------------------------------------------------------------- */
/* Exported symbols of libslowrank_cupti.so                                */
/* ---------------------------------------------------------------------- */
#define SLOWRANK_SYM_EMIT      "slowrank_cupti_emit"
#define SLOWRANK_SYM_SEMAPHORE "slowrank_cupti_semaphore"
#define SLOWRANK_SYM_CONTROL   "slowrank_cupti_control"
#define SLOWRANK_SYM_HANDBACK  "slowrank_cupti_handback"
#define SLOWRANK_SYM_NCCL_STATUS "slowrank_nccl_status"
#define SLOWRANK_SYM_NCCL_V5   "ncclProfiler_v5"
#define SLOWRANK_SYM_NCCL_V4   "ncclProfiler_v4"
#define SLOWRANK_SEMAPHORE_SECTION ".probes"

#ifndef __cplusplus
#define SLOWRANK_ABI_ASSERT(c, m) _Static_assert(c, m)
#else
#define SLOWRANK_ABI_ASSERT(c, m) static_assert(c, m)
#endif

SLOWRANK_ABI_ASSERT(sizeof(struct slowrank_batch_header) == 64, "batch header size");
SLOWRANK_ABI_ASSERT(sizeof(struct slowrank_record_header) == 4, "record header size");
SLOWRANK_ABI_ASSERT(sizeof(struct slowrank_kernel_record) == 72, "kernel record size");
SLOWRANK_ABI_ASSERT(sizeof(struct slowrank_copy_record) == 48, "copy record size");
SLOWRANK_ABI_ASSERT(sizeof(struct slowrank_name_record) == 16, "name record size");
SLOWRANK_ABI_ASSERT(sizeof(struct slowrank_stats_record) == 8, "stats record size");
SLOWRANK_ABI_ASSERT(sizeof(struct slowrank_transition_record) == 16, "transition record size");
SLOWRANK_ABI_ASSERT(sizeof(struct slowrank_nccl_comm_record) == 48, "nccl comm record size");
SLOWRANK_ABI_ASSERT(sizeof(struct slowrank_nccl_coll_record) == 88, "nccl coll record size");
SLOWRANK_ABI_ASSERT(sizeof(struct slowrank_nccl_kernel_record) == 64, "nccl kernel record size");
SLOWRANK_ABI_ASSERT(sizeof(struct slowrank_nccl_status) == 64, "nccl status size");
SLOWRANK_ABI_ASSERT(sizeof(struct slowrank_cupti_control) == 192, "control block size");
SLOWRANK_ABI_ASSERT(sizeof(struct slowrank_cupti_handback) == 144, "handback block size");
SLOWRANK_ABI_ASSERT(SLOWRANK_BATCH_MAX <= 65535, "record sizes are u16");

/* clang-format on */

#ifdef __cplusplus
}
#endif

#endif /* SLOWRANK_ABI_H */
