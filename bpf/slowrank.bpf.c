//go:build ignore
// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//
// slowrank.bpf.c - uprobes on NCCL, CUDA runtime/driver synchronisation, torch
// c10d and the CUPTI injection library's emit function.
//
// Every probe has two kinds of programs. For perf-event uprobes (kernels
// without uprobe_multi, --single-uprobes), one entry program and (for
// intervals) one return program per function, generated below from a shape
// macro with the probe id and argument layout (enum sr_layout) as
// compile-time constants. For uprobe_multi links, the multi_* programs, one
// per record type and direction, read both from the attach cookie: one link
// per library, probe class and direction carries all its functions (a
// SIGKILLed agent's links are released one after another, see
// docs/internals.md "A killed agent"). Entry and return are joined per
// (tid, probe id) in the `inflight` LRU hash; one record per call leaves
// through the `events` ring buffer at return. Only tgids present in
// `tracked_tgids` (filled by Go) are recorded.
//
// x86-64 only: arguments follow the SysV ABI (rdi, rsi, rdx, rcx, r8, r9, then
// the stack; at function entry [rsp] is the return address, so the 7th integer
// argument is at rsp+8 and a by-value struct of class MEMORY such as
// ncclUniqueId is copied to the argument area starting at rsp+8).

#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "events.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

// Read by Go at load time to refuse an object that does not match its decoder.
volatile const __u32 slowrank_events_version = SLOWRANK_EVENTS_VERSION;

// Set by Go at load time: records are submitted without waking the reader
// (which polls) until this many bytes are pending. A wakeup per record costs
// the traced thread an irq_work and often an IPI.
volatile const __u64 wakeup_bytes = 65536;

#define EEXIST 17

// Default size; Go overrides max_entries in the spec before loading.
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4 << 20);
} events SEC(".maps");

struct sr_inflight_key {
	__u32 tid;
	__u32 probe_id;
};

struct sr_inflight {
	__u64 start_ns;
	__u64 a[6]; // per-shape saved arguments
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct sr_inflight_key);
	__type(value, struct sr_inflight);
} inflight SEC(".maps");

// tgid -> rank (the value is informational for now; presence means tracked).
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, __u32);
} tracked_tgids SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, SR_CNT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} counters SEC(".maps");

// Keep every type that bpf2go mirrors (-type) in BTF: a pointer global emits
// the full pointee type. Never read; they live in .rodata.
#define BTF_ANCHOR(type, name) type *const volatile sr_btf_##name __attribute__((unused))
BTF_ANCHOR(struct sr_event_hdr, hdr);
BTF_ANCHOR(struct sr_coll_event, coll);
BTF_ANCHOR(struct sr_comm_init_event, comm_init);
BTF_ANCHOR(struct sr_sync_event, sync);
BTF_ANCHOR(struct sr_group_event, group);
BTF_ANCHOR(struct sr_torch_event, torch);
BTF_ANCHOR(struct sr_batch_event, batch);
BTF_ANCHOR(struct sr_cupti_call_event, cupti_call);
BTF_ANCHOR(enum sr_event_type, type);
BTF_ANCHOR(enum sr_probe_id, probe);
BTF_ANCHOR(enum sr_layout, layout);
BTF_ANCHOR(enum sr_counter, counter);

static __always_inline void count(__u32 idx)
{
	__u64 *v = bpf_map_lookup_elem(&counters, &idx);
	if (v)
		*v += 1;
}

static __always_inline int tracked(__u32 tgid)
{
	return bpf_map_lookup_elem(&tracked_tgids, &tgid) != 0;
}

// At entry only: the n-th (1-based) stack-passed integer argument.
static __always_inline __u64 stack_arg(struct pt_regs *ctx, int n)
{
	__u64 v = 0;
	if (bpf_probe_read_user(&v, sizeof(v), (void *)(PT_REGS_SP(ctx) + 8 * n)))
		count(SR_CNT_READ_FAULT);
	return v;
}

#define ARG1(ctx) ((__u64)PT_REGS_PARM1(ctx))
#define ARG2(ctx) ((__u64)PT_REGS_PARM2(ctx))
#define ARG3(ctx) ((__u64)PT_REGS_PARM3(ctx))
#define ARG4(ctx) ((__u64)PT_REGS_PARM4(ctx))
#define ARG5(ctx) ((__u64)PT_REGS_PARM5(ctx))
#define ARG6(ctx) ((__u64)(ctx)->r9)
#define RET(ctx) ((__s32)PT_REGS_RC(ctx))

static __always_inline void fill_hdr(struct sr_event_hdr *h, __u32 type, __u32 probe,
				     __u64 pid_tgid, __u64 start, __u64 end)
{
	h->type = type;
	h->probe_id = probe;
	h->pid = pid_tgid >> 32;
	h->tid = (__u32)pid_tgid;
	h->start_ns = start;
	h->end_ns = end;
}

static __always_inline void *reserve(__u64 size)
{
	void *e = bpf_ringbuf_reserve(&events, size, 0);
	if (!e)
		count(SR_CNT_RINGBUF_FULL);
	return e;
}

static __always_inline void submit(void *e)
{
	__u64 pending = bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA);
	bpf_ringbuf_submit(e, pending >= wakeup_bytes ? BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP);
	count(SR_CNT_EVENTS);
}

// Entry half: returns 0 when the caller is not tracked.
static __always_inline int entry_begin(struct sr_inflight *v)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	if (!tracked(tgid)) {
		count(SR_CNT_FILTERED);
		return 0;
	}
	v->start_ns = bpf_ktime_get_ns();
	return 1;
}

static __always_inline void entry_store(__u32 probe, struct sr_inflight *v)
{
	struct sr_inflight_key k = {
		.tid = (__u32)bpf_get_current_pid_tgid(),
		.probe_id = probe,
	};
	long err = bpf_map_update_elem(&inflight, &k, v, BPF_NOEXIST);
	if (err == -EEXIST) {
		count(SR_CNT_ENTRY_OVERWRITTEN);
		err = bpf_map_update_elem(&inflight, &k, v, BPF_ANY);
	}
	if (err)
		count(SR_CNT_INFLIGHT_FAILED);
}

// Return half: moves the pending entry of (tid, probe) to *out.
static __always_inline int return_take(__u32 probe, struct sr_inflight *out, __u64 *pid_tgid)
{
	__u64 id = bpf_get_current_pid_tgid();
	struct sr_inflight_key k = {
		.tid = (__u32)id,
		.probe_id = probe,
	};
	struct sr_inflight *v = bpf_map_lookup_elem(&inflight, &k);
	if (!v) {
		if (tracked(id >> 32))
			count(SR_CNT_MISSING_ENTRY);
		return 0;
	}
	__builtin_memcpy(out, v, sizeof(*out));
	bpf_map_delete_elem(&inflight, &k);
	*pid_tgid = id;
	return 1;
}

// ---------------------------------------------------------------- collectives

// a[0]=count a[1]=comm a[2]=stream a[3]=datatype|redop<<32 a[4]=peer
static __always_inline int coll_entry(struct pt_regs *ctx, __u32 probe, __u32 shape)
{
	struct sr_inflight v = {};
	if (!entry_begin(&v))
		return 0;
	__u64 dt = 0, op = 0;
	__s32 peer = -1;
	switch (shape) {
	case SR_LAYOUT_COLL_OP7:
		v.a[0] = ARG3(ctx);
		dt = (__u32)ARG4(ctx);
		op = (__u32)ARG5(ctx);
		v.a[1] = ARG6(ctx);
		v.a[2] = stack_arg(ctx, 1);
		break;
	case SR_LAYOUT_COLL_ROOT7:
		v.a[0] = ARG3(ctx);
		dt = (__u32)ARG4(ctx);
		peer = (__s32)ARG5(ctx);
		v.a[1] = ARG6(ctx);
		v.a[2] = stack_arg(ctx, 1);
		break;
	case SR_LAYOUT_COLL_REDUCE8:
		v.a[0] = ARG3(ctx);
		dt = (__u32)ARG4(ctx);
		op = (__u32)ARG5(ctx);
		peer = (__s32)ARG6(ctx);
		v.a[1] = stack_arg(ctx, 1);
		v.a[2] = stack_arg(ctx, 2);
		break;
	case SR_LAYOUT_COLL_PLAIN6:
		v.a[0] = ARG3(ctx);
		dt = (__u32)ARG4(ctx);
		v.a[1] = ARG5(ctx);
		v.a[2] = ARG6(ctx);
		break;
	case SR_LAYOUT_COLL_PEER6:
		v.a[0] = ARG2(ctx);
		dt = (__u32)ARG3(ctx);
		peer = (__s32)ARG4(ctx);
		v.a[1] = ARG5(ctx);
		v.a[2] = ARG6(ctx);
		break;
	}
	v.a[3] = dt | (op << 32);
	v.a[4] = (__u32)peer;
	entry_store(probe, &v);
	return 0;
}

static __always_inline int coll_return(struct pt_regs *ctx, __u32 probe)
{
	struct sr_inflight v;
	__u64 id;
	if (!return_take(probe, &v, &id))
		return 0;
	__u64 now = bpf_ktime_get_ns();
	struct sr_coll_event *e = reserve(sizeof(*e));
	if (!e)
		return 0;
	fill_hdr(&e->hdr, SR_EV_COLL, probe, id, v.start_ns, now);
	e->count = v.a[0];
	e->comm = v.a[1];
	e->stream = v.a[2];
	e->datatype = (__u32)v.a[3];
	e->redop = (__u32)(v.a[3] >> 32);
	e->peer = (__s32)v.a[4];
	e->ret = RET(ctx);
	submit(e);
	return 0;
}

#define COLL_PROBE(name, probe, shape)                                                             \
	SEC("uprobe")                                                                              \
	int name##_entry(struct pt_regs *ctx)                                                      \
	{                                                                                          \
		return coll_entry(ctx, probe, shape);                                              \
	}                                                                                          \
	SEC("uretprobe")                                                                           \
	int name##_return(struct pt_regs *ctx)                                                     \
	{                                                                                          \
		return coll_return(ctx, probe);                                                    \
	}

COLL_PROBE(nccl_all_reduce, SR_PROBE_NCCL_ALL_REDUCE, SR_LAYOUT_COLL_OP7)
COLL_PROBE(nccl_broadcast, SR_PROBE_NCCL_BROADCAST, SR_LAYOUT_COLL_ROOT7)
COLL_PROBE(nccl_reduce, SR_PROBE_NCCL_REDUCE, SR_LAYOUT_COLL_REDUCE8)
COLL_PROBE(nccl_all_gather, SR_PROBE_NCCL_ALL_GATHER, SR_LAYOUT_COLL_PLAIN6)
COLL_PROBE(nccl_reduce_scatter, SR_PROBE_NCCL_REDUCE_SCATTER, SR_LAYOUT_COLL_OP7)
COLL_PROBE(nccl_send, SR_PROBE_NCCL_SEND, SR_LAYOUT_COLL_PEER6)
COLL_PROBE(nccl_recv, SR_PROBE_NCCL_RECV, SR_LAYOUT_COLL_PEER6)
COLL_PROBE(nccl_all_to_all, SR_PROBE_NCCL_ALL_TO_ALL, SR_LAYOUT_COLL_PLAIN6)
COLL_PROBE(nccl_bcast, SR_PROBE_NCCL_BCAST, SR_LAYOUT_COLL_PEER6)
COLL_PROBE(nccl_gather, SR_PROBE_NCCL_GATHER, SR_LAYOUT_COLL_ROOT7)
COLL_PROBE(nccl_scatter, SR_PROBE_NCCL_SCATTER, SR_LAYOUT_COLL_ROOT7)

// ---------------------------------------------------------------- groups

static __always_inline int group_start(__u32 probe)
{
	__u64 id = bpf_get_current_pid_tgid();
	if (!tracked(id >> 32)) {
		count(SR_CNT_FILTERED);
		return 0;
	}
	__u64 now = bpf_ktime_get_ns();
	struct sr_group_event *e = reserve(sizeof(*e));
	if (!e)
		return 0;
	fill_hdr(&e->hdr, SR_EV_GROUP, probe, id, now, now);
	e->ret = 0;
	e->flags = 0;
	submit(e);
	return 0;
}

static __always_inline int group_end_entry(__u32 probe)
{
	struct sr_inflight v = {};
	if (!entry_begin(&v))
		return 0;
	entry_store(probe, &v);
	return 0;
}

static __always_inline int group_end_return(struct pt_regs *ctx, __u32 probe)
{
	struct sr_inflight v;
	__u64 id;
	if (!return_take(probe, &v, &id))
		return 0;
	__u64 now = bpf_ktime_get_ns();
	struct sr_group_event *e = reserve(sizeof(*e));
	if (!e)
		return 0;
	fill_hdr(&e->hdr, SR_EV_GROUP, probe, id, v.start_ns, now);
	e->ret = RET(ctx);
	e->flags = SR_GROUP_F_RETURN;
	submit(e);
	return 0;
}

SEC("uprobe")
int nccl_group_start_entry(struct pt_regs *ctx)
{
	return group_start(SR_PROBE_NCCL_GROUP_START);
}

SEC("uprobe")
int nccl_group_end_entry(struct pt_regs *ctx)
{
	return group_end_entry(SR_PROBE_NCCL_GROUP_END);
}

SEC("uretprobe")
int nccl_group_end_return(struct pt_regs *ctx)
{
	return group_end_return(ctx, SR_PROBE_NCCL_GROUP_END);
}

// ---------------------------------------------------------------- communicator init

// FNV-1a 64 of the 128-byte ncclUniqueId at uptr (user memory).
static __always_inline int hash_unique_id(const void *uptr, __u64 *out)
{
	__u8 buf[SR_NCCL_UNIQUE_ID_BYTES];
	if (bpf_probe_read_user(buf, sizeof(buf), uptr)) {
		count(SR_CNT_READ_FAULT);
		return 0;
	}
	__u64 h = 0xcbf29ce484222325ULL;
#pragma unroll
	for (int i = 0; i < SR_NCCL_UNIQUE_ID_BYTES; i++) {
		h ^= buf[i];
		h *= 0x100000001b3ULL;
	}
	*out = h;
	return 1;
}

// a[0]=comm out-pointer a[1]=id hash a[2]=parent a[3]=nranks|rank<<32
// a[4]=color|key<<32 a[5]=flags|n_ids<<32
static __always_inline int init_entry(struct pt_regs *ctx, __u32 probe, __u32 shape)
{
	struct sr_inflight v = {};
	if (!entry_begin(&v))
		return 0;
	__s32 nranks = -1, rank = -1, color = 0, key = 0;
	__u32 flags = 0, n_ids = 0;
	__u64 h = 0;
	switch (shape) {
	case SR_LAYOUT_INIT_RANK:
		v.a[0] = ARG1(ctx);
		nranks = (__s32)ARG2(ctx);
		rank = (__s32)ARG3(ctx);
		n_ids = 1;
		if (hash_unique_id((void *)(PT_REGS_SP(ctx) + 8), &h))
			flags |= SR_COMM_F_ID_VALID;
		break;
	case SR_LAYOUT_INIT_SCALABLE:
		v.a[0] = ARG1(ctx);
		nranks = (__s32)ARG2(ctx);
		rank = (__s32)ARG3(ctx);
		n_ids = (__u32)ARG4(ctx);
		if (hash_unique_id((void *)ARG5(ctx), &h))
			flags |= SR_COMM_F_ID_VALID;
		break;
	case SR_LAYOUT_INIT_ALL:
		v.a[0] = ARG1(ctx);
		nranks = (__s32)ARG2(ctx);
		break;
	case SR_LAYOUT_SPLIT:
		v.a[2] = ARG1(ctx);
		color = (__s32)ARG2(ctx);
		key = (__s32)ARG3(ctx);
		v.a[0] = ARG4(ctx);
		flags |= SR_COMM_F_PARENT;
		break;
	}
	v.a[1] = h;
	v.a[3] = (__u32)nranks | ((__u64)(__u32)rank << 32);
	v.a[4] = (__u32)color | ((__u64)(__u32)key << 32);
	v.a[5] = flags | ((__u64)n_ids << 32);
	entry_store(probe, &v);
	return 0;
}

static __always_inline int init_return(struct pt_regs *ctx, __u32 probe)
{
	struct sr_inflight v;
	__u64 id;
	if (!return_take(probe, &v, &id))
		return 0;
	__u64 now = bpf_ktime_get_ns();
	__u32 flags = (__u32)v.a[5];
	__u64 comm = 0;
	if (v.a[0]) {
		if (bpf_probe_read_user(&comm, sizeof(comm), (void *)v.a[0]) == 0)
			flags |= SR_COMM_F_COMM_VALID;
		else
			count(SR_CNT_READ_FAULT);
	}
	struct sr_comm_init_event *e = reserve(sizeof(*e));
	if (!e)
		return 0;
	fill_hdr(&e->hdr, SR_EV_COMM_INIT, probe, id, v.start_ns, now);
	e->id_hash = v.a[1];
	e->comm = comm;
	e->parent_comm = v.a[2];
	e->nranks = (__s32)v.a[3];
	e->rank = (__s32)(v.a[3] >> 32);
	e->color = (__s32)v.a[4];
	e->key = (__s32)(v.a[4] >> 32);
	e->ret = RET(ctx);
	e->flags = flags;
	e->n_ids = (__u32)(v.a[5] >> 32);
	e->_pad = 0;
	submit(e);
	return 0;
}

#define INIT_PROBE(name, probe, shape)                                                             \
	SEC("uprobe")                                                                              \
	int name##_entry(struct pt_regs *ctx)                                                      \
	{                                                                                          \
		return init_entry(ctx, probe, shape);                                              \
	}                                                                                          \
	SEC("uretprobe")                                                                           \
	int name##_return(struct pt_regs *ctx)                                                     \
	{                                                                                          \
		return init_return(ctx, probe);                                                    \
	}

INIT_PROBE(nccl_comm_init_rank, SR_PROBE_NCCL_COMM_INIT_RANK, SR_LAYOUT_INIT_RANK)
INIT_PROBE(nccl_comm_init_rank_config, SR_PROBE_NCCL_COMM_INIT_RANK_CONFIG, SR_LAYOUT_INIT_RANK)
INIT_PROBE(nccl_comm_init_all, SR_PROBE_NCCL_COMM_INIT_ALL, SR_LAYOUT_INIT_ALL)
INIT_PROBE(nccl_comm_split, SR_PROBE_NCCL_COMM_SPLIT, SR_LAYOUT_SPLIT)
INIT_PROBE(nccl_comm_init_rank_scalable, SR_PROBE_NCCL_COMM_INIT_RANK_SCALABLE,
	   SR_LAYOUT_INIT_SCALABLE)

// ---------------------------------------------------------------- synchronisation waits

// a[0]=stream/event handle
static __always_inline int sync_entry(struct pt_regs *ctx, __u32 probe, __u32 layout)
{
	struct sr_inflight v = {};
	if (!entry_begin(&v))
		return 0;
	if (layout == SR_LAYOUT_SYNC_HANDLE)
		v.a[0] = ARG1(ctx);
	entry_store(probe, &v);
	return 0;
}

static __always_inline int sync_return(struct pt_regs *ctx, __u32 probe)
{
	struct sr_inflight v;
	__u64 id;
	if (!return_take(probe, &v, &id))
		return 0;
	__u64 now = bpf_ktime_get_ns();
	struct sr_sync_event *e = reserve(sizeof(*e));
	if (!e)
		return 0;
	fill_hdr(&e->hdr, SR_EV_SYNC, probe, id, v.start_ns, now);
	e->handle = v.a[0];
	e->ret = RET(ctx);
	e->_pad = 0;
	submit(e);
	return 0;
}

#define SYNC_PROBE(name, probe, layout)                                                            \
	SEC("uprobe")                                                                              \
	int name##_entry(struct pt_regs *ctx)                                                      \
	{                                                                                          \
		return sync_entry(ctx, probe, layout);                                             \
	}                                                                                          \
	SEC("uretprobe")                                                                           \
	int name##_return(struct pt_regs *ctx)                                                     \
	{                                                                                          \
		return sync_return(ctx, probe);                                                    \
	}

SYNC_PROBE(cuda_device_synchronize, SR_PROBE_CUDA_DEVICE_SYNCHRONIZE, SR_LAYOUT_SYNC)
SYNC_PROBE(cuda_stream_synchronize, SR_PROBE_CUDA_STREAM_SYNCHRONIZE, SR_LAYOUT_SYNC_HANDLE)
SYNC_PROBE(cuda_event_synchronize, SR_PROBE_CUDA_EVENT_SYNCHRONIZE, SR_LAYOUT_SYNC_HANDLE)
SYNC_PROBE(cu_ctx_synchronize, SR_PROBE_CU_CTX_SYNCHRONIZE, SR_LAYOUT_SYNC)
SYNC_PROBE(cu_stream_synchronize, SR_PROBE_CU_STREAM_SYNCHRONIZE, SR_LAYOUT_SYNC_HANDLE)
SYNC_PROBE(cu_event_synchronize, SR_PROBE_CU_EVENT_SYNCHRONIZE, SR_LAYOUT_SYNC_HANDLE)

// ---------------------------------------------------------------- torch c10d

// a[0]=rdi a[1]=rsi
static __always_inline int torch_entry(struct pt_regs *ctx, __u32 probe)
{
	struct sr_inflight v = {};
	if (!entry_begin(&v))
		return 0;
	v.a[0] = ARG1(ctx);
	v.a[1] = ARG2(ctx);
	entry_store(probe, &v);
	return 0;
}

static __always_inline int torch_return(struct pt_regs *ctx, __u32 probe)
{
	struct sr_inflight v;
	__u64 id;
	if (!return_take(probe, &v, &id))
		return 0;
	__u64 now = bpf_ktime_get_ns();
	struct sr_torch_event *e = reserve(sizeof(*e));
	if (!e)
		return 0;
	fill_hdr(&e->hdr, SR_EV_TORCH, probe, id, v.start_ns, now);
	e->arg0 = v.a[0];
	e->arg1 = v.a[1];
	submit(e);
	return 0;
}

#define TORCH_PROBE(name, probe)                                                                   \
	SEC("uprobe")                                                                              \
	int name##_entry(struct pt_regs *ctx)                                                      \
	{                                                                                          \
		return torch_entry(ctx, probe);                                                    \
	}                                                                                          \
	SEC("uretprobe")                                                                           \
	int name##_return(struct pt_regs *ctx)                                                     \
	{                                                                                          \
		return torch_return(ctx, probe);                                                   \
	}

TORCH_PROBE(torch_nccl_allreduce, SR_PROBE_TORCH_NCCL_ALLREDUCE)
TORCH_PROBE(torch_nccl_allreduce_coalesced, SR_PROBE_TORCH_NCCL_ALLREDUCE_COALESCED)
TORCH_PROBE(torch_nccl_broadcast, SR_PROBE_TORCH_NCCL_BROADCAST)
TORCH_PROBE(torch_nccl_reduce, SR_PROBE_TORCH_NCCL_REDUCE)
TORCH_PROBE(torch_nccl_allgather, SR_PROBE_TORCH_NCCL_ALLGATHER)
TORCH_PROBE(torch_nccl_allgather_base, SR_PROBE_TORCH_NCCL_ALLGATHER_BASE)
TORCH_PROBE(torch_nccl_allgather_coalesced, SR_PROBE_TORCH_NCCL_ALLGATHER_COALESCED)
TORCH_PROBE(torch_nccl_reduce_scatter, SR_PROBE_TORCH_NCCL_REDUCE_SCATTER)
TORCH_PROBE(torch_nccl_reduce_scatter_base, SR_PROBE_TORCH_NCCL_REDUCE_SCATTER_BASE)
TORCH_PROBE(torch_nccl_reduce_scatter_coalesced, SR_PROBE_TORCH_NCCL_REDUCE_SCATTER_COALESCED)
TORCH_PROBE(torch_nccl_alltoall, SR_PROBE_TORCH_NCCL_ALLTOALL)
TORCH_PROBE(torch_nccl_alltoall_base, SR_PROBE_TORCH_NCCL_ALLTOALL_BASE)
TORCH_PROBE(torch_nccl_barrier, SR_PROBE_TORCH_NCCL_BARRIER)
TORCH_PROBE(torch_nccl_send, SR_PROBE_TORCH_NCCL_SEND)
TORCH_PROBE(torch_nccl_recv, SR_PROBE_TORCH_NCCL_RECV)
TORCH_PROBE(torch_nccl_work_wait, SR_PROBE_TORCH_NCCL_WORK_WAIT)
TORCH_PROBE(torch_gloo_allreduce, SR_PROBE_TORCH_GLOO_ALLREDUCE)
TORCH_PROBE(torch_gloo_allreduce_coalesced, SR_PROBE_TORCH_GLOO_ALLREDUCE_COALESCED)
TORCH_PROBE(torch_gloo_broadcast, SR_PROBE_TORCH_GLOO_BROADCAST)
TORCH_PROBE(torch_gloo_reduce, SR_PROBE_TORCH_GLOO_REDUCE)
TORCH_PROBE(torch_gloo_allgather, SR_PROBE_TORCH_GLOO_ALLGATHER)
TORCH_PROBE(torch_gloo_allgather_base, SR_PROBE_TORCH_GLOO_ALLGATHER_BASE)
TORCH_PROBE(torch_gloo_allgather_coalesced, SR_PROBE_TORCH_GLOO_ALLGATHER_COALESCED)
TORCH_PROBE(torch_gloo_reduce_scatter, SR_PROBE_TORCH_GLOO_REDUCE_SCATTER)
TORCH_PROBE(torch_gloo_reduce_scatter_base, SR_PROBE_TORCH_GLOO_REDUCE_SCATTER_BASE)
TORCH_PROBE(torch_gloo_reduce_scatter_coalesced, SR_PROBE_TORCH_GLOO_REDUCE_SCATTER_COALESCED)
TORCH_PROBE(torch_gloo_alltoall, SR_PROBE_TORCH_GLOO_ALLTOALL)
TORCH_PROBE(torch_gloo_alltoall_base, SR_PROBE_TORCH_GLOO_ALLTOALL_BASE)
TORCH_PROBE(torch_gloo_barrier, SR_PROBE_TORCH_GLOO_BARRIER)
TORCH_PROBE(torch_gloo_send, SR_PROBE_TORCH_GLOO_SEND)
TORCH_PROBE(torch_gloo_recv, SR_PROBE_TORCH_GLOO_RECV)
TORCH_PROBE(torch_work_wait, SR_PROBE_TORCH_WORK_WAIT)
TORCH_PROBE(torch_future_wait, SR_PROBE_TORCH_FUTURE_WAIT)

// ---------------------------------------------------------------- CUPTI batches

// Reserve a record of a constant size class (the verifier wants a constant
// size for bpf_ringbuf_reserve) and copy len <= class bytes into it.
static __always_inline int emit_batch(const void *src, __u32 len, const __u32 class, __u64 id,
				      __u64 now)
{
	struct sr_batch_event *e = reserve(SR_BATCH_DATA_OFFSET + class);
	if (!e)
		return 0;
	fill_hdr(&e->hdr, SR_EV_BATCH, SR_PROBE_CUPTI_EMIT, id, now, now);
	e->len = len;
	e->_pad = 0;
	if (len > class)
		len = class; // already true; restated for the verifier
	if (bpf_probe_read_user(e->data, len, src)) {
		count(SR_CNT_READ_FAULT);
		bpf_ringbuf_discard(e, BPF_RB_NO_WAKEUP);
		return 0;
	}
	submit(e);
	return 0;
}

// void slowrank_cupti_emit(const void *batch, uint32_t len)
static __always_inline int cupti_emit(struct pt_regs *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	if (!tracked(id >> 32)) {
		count(SR_CNT_FILTERED);
		return 0;
	}
	__u64 now = bpf_ktime_get_ns();
	const void *src = (const void *)ARG1(ctx);
	__u32 len = (__u32)ARG2(ctx);
	if (len == 0)
		return 0;
	if (len > SLOWRANK_BATCH_MAX) {
		count(SR_CNT_BATCH_OVERSIZE);
		return 0;
	}
	if (len <= 512)
		return emit_batch(src, len, 512, id, now);
	if (len <= 2048)
		return emit_batch(src, len, 2048, id, now);
	if (len <= 8192)
		return emit_batch(src, len, 8192, id, now);
	return emit_batch(src, len, SLOWRANK_BATCH_MAX, id, now);
}

SEC("uprobe")
int cupti_emit_entry(struct pt_regs *ctx)
{
	return cupti_emit(ctx);
}

// ---------------------------------------------------------------- libcupti calls

// Entry of a libcupti function: who called it (the agent tells the injection
// library's control thread from another CUPTI client such as Kineto) and its
// first two arguments. Rare calls, woken at once: the injection library yields
// within the agent's reaction time.
static __always_inline int cupti_call(struct pt_regs *ctx, __u32 probe)
{
	__u64 id = bpf_get_current_pid_tgid();
	if (!tracked(id >> 32)) {
		count(SR_CNT_FILTERED);
		return 0;
	}
	__u64 now = bpf_ktime_get_ns();
	struct sr_cupti_call_event *e = reserve(sizeof(*e));
	if (!e)
		return 0;
	fill_hdr(&e->hdr, SR_EV_CUPTI_CALL, probe, id, now, now);
	e->arg = ARG1(ctx);
	e->arg2 = ARG2(ctx);
	bpf_ringbuf_submit(e, BPF_RB_FORCE_WAKEUP);
	count(SR_CNT_EVENTS);
	return 0;
}

#define CUPTI_CALL_PROBE(name, probe)                                                              \
	SEC("uprobe")                                                                              \
	int name##_entry(struct pt_regs *ctx)                                                      \
	{                                                                                          \
		return cupti_call(ctx, probe);                                                     \
	}

CUPTI_CALL_PROBE(cupti_subscribe, SR_PROBE_CUPTI_SUBSCRIBE)
CUPTI_CALL_PROBE(cupti_register_callbacks, SR_PROBE_CUPTI_REGISTER_CALLBACKS)
CUPTI_CALL_PROBE(cupti_register_timestamp, SR_PROBE_CUPTI_REGISTER_TIMESTAMP)
CUPTI_CALL_PROBE(cupti_enable, SR_PROBE_CUPTI_ENABLE)
CUPTI_CALL_PROBE(cupti_disable, SR_PROBE_CUPTI_DISABLE)
CUPTI_CALL_PROBE(cupti_flush_all, SR_PROBE_CUPTI_FLUSH_ALL)
CUPTI_CALL_PROBE(cupti_finalize, SR_PROBE_CUPTI_FINALIZE)

// ---------------------------------------------------------------- shared programs (uprobe_multi)

// The programs of the uprobe_multi links: one link per library, probe class
// and direction carries every function of the class, each with its own
// attach cookie (probe id | layout << SR_COOKIE_LAYOUT_SHIFT, set by
// bpf/attach.go), so one program per record type and direction serves them
// all. The torch classes share theirs.

static __always_inline __u32 cookie_probe(__u64 cookie)
{
	return (__u32)cookie;
}

static __always_inline __u32 cookie_layout(__u64 cookie)
{
	return (__u32)(cookie >> SR_COOKIE_LAYOUT_SHIFT);
}

#define MULTI_INTERVAL(name, entry_fn, return_fn)                                                  \
	SEC("uprobe.multi")                                                                        \
	int multi_##name##_entry(struct pt_regs *ctx)                                              \
	{                                                                                          \
		__u64 c = bpf_get_attach_cookie(ctx);                                              \
		return entry_fn(ctx, cookie_probe(c), cookie_layout(c));                           \
	}                                                                                          \
	SEC("uretprobe.multi")                                                                     \
	int multi_##name##_return(struct pt_regs *ctx)                                             \
	{                                                                                          \
		return return_fn(ctx, cookie_probe(bpf_get_attach_cookie(ctx)));                   \
	}

static __always_inline int torch_entry_layout(struct pt_regs *ctx, __u32 probe, __u32 layout)
{
	return torch_entry(ctx, probe);
}

static __always_inline int group_entry(struct pt_regs *ctx, __u32 probe, __u32 layout)
{
	if (layout == SR_LAYOUT_GROUP_START)
		return group_start(probe);
	return group_end_entry(probe);
}

MULTI_INTERVAL(coll, coll_entry, coll_return)
MULTI_INTERVAL(group, group_entry, group_end_return)
MULTI_INTERVAL(init, init_entry, init_return)
MULTI_INTERVAL(sync, sync_entry, sync_return)
MULTI_INTERVAL(torch, torch_entry_layout, torch_return)

SEC("uprobe.multi")
int multi_cupti_emit_entry(struct pt_regs *ctx)
{
	return cupti_emit(ctx);
}

SEC("uprobe.multi")
int multi_cupti_call_entry(struct pt_regs *ctx)
{
	return cupti_call(ctx, cookie_probe(bpf_get_attach_cookie(ctx)));
}
