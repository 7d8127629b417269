package bpf

import (
	"fmt"
	"path/filepath"
	"strings"
)

// ProbeID says which symbol produced an event (enum sr_probe_id in events.h).
// The constants are generated from the C enum (wire_gen.go).
type ProbeID uint32

// Symbols of the CUPTI injection library (cupti/slowrank_abi.h).
const (
	CUPTIEmitSymbol      = "slowrank_cupti_emit"
	CUPTISemaphoreSymbol = "slowrank_cupti_semaphore"
)

// LibKind is the kind of library a probe lives in.
//
//go:generate go run golang.org/x/tools/cmd/stringer@v0.52.0 -type LibKind -linecomment
type LibKind uint8

// Library kinds. The line comments are the String() names (stringer
// -linecomment, libkind_string.go).
//
//	LibNCCL          libnccl.so* (or librccl.so*)
//	LibCUDART        libcudart.so*
//	LibCUDA          libcuda.so* (driver API)
//	LibTorch         libtorch_cpu.so (gloo) and libtorch_cuda.so (NCCL)
//	LibCUPTI         libslowrank_cupti.so (the injection library)
//	LibCUPTIRuntime  libcupti.so* (NVIDIA's; watched for other CUPTI clients)
const (
	LibNCCL         LibKind = iota + 1 // nccl
	LibCUDART                          // cudart
	LibCUDA                            // cuda
	LibTorch                           // torch
	LibCUPTI                           // cupti
	LibCUPTIRuntime                    // libcupti
)

// ClassifyLibrary says which kind a mapped library file is, by its base name
// (as seen in /proc/PID/maps). It returns false for libraries slowrank does
// not probe.
func ClassifyLibrary(path string) (LibKind, bool) {
	base := filepath.Base(path)
	is := func(stem string) bool { return base == stem || strings.HasPrefix(base, stem+".") }
	switch {
	case is("libnccl.so"), is("librccl.so"):
		return LibNCCL, true
	case is("libcudart.so"):
		return LibCUDART, true
	case is("libcuda.so"):
		return LibCUDA, true
	case is("libtorch_cpu.so"), is("libtorch_cuda.so"), is("libtorch_cuda_cpp.so"):
		return LibTorch, true
	case is("libslowrank_cupti.so"):
		return LibCUPTI, true
	case is("libcupti.so"):
		return LibCUPTIRuntime, true
	}
	return 0, false
}

// ProbeSpec describes one probe as data: where it attaches, which programs
// run, and what a missing symbol means. One generic mechanism (AttachLibrary)
// handles every spec.
type ProbeSpec struct {
	ID   ProbeID
	Kind LibKind
	// Symbol is the exact ELF symbol (C functions).
	Symbol string
	// Qualified is a C++ qualified name ("c10d::ProcessGroupNCCL::allreduce")
	// matched against the Itanium-mangled symbol prefix, every overload.
	Qualified string
	// Entry and Return are program names in slowrank.bpf.c; Return is empty
	// for entry-only probes.
	Entry, Return string
	// Optional: the symbol is absent in some versions; missing it is normal.
	Optional bool
	// RefCtr names a uint16 semaphore symbol in the same library used as the
	// uprobe reference counter (ref_ctr_offset): non-zero while attached.
	RefCtr string
	// SelfArg is, for C++ methods, which argument register holds `this`:
	// 0 (rdi) normally, 1 (rsi) when the return value is a class returned
	// through a hidden pointer (c10::intrusive_ptr<Work>).
	SelfArg int
}

// Name is the symbol or qualified name the spec matches.
func (s ProbeSpec) Name() string {
	if s.Qualified != "" {
		return s.Qualified
	}
	return s.Symbol
}

func interval(id ProbeID, kind LibKind, sym, prog string, optional bool) ProbeSpec {
	return ProbeSpec{ID: id, Kind: kind, Symbol: sym, Entry: prog + "_entry", Return: prog + "_return", Optional: optional}
}

func torch(id ProbeID, qualified, prog string, selfArg int) ProbeSpec {
	return ProbeSpec{ID: id, Kind: LibTorch, Qualified: qualified, Entry: prog + "_entry",
		Return: prog + "_return", Optional: true, SelfArg: selfArg}
}

// specs is the probe table. Required (non-optional) symbols exist in every
// NCCL >= 2.7 and CUDA >= 11.
var specs = []ProbeSpec{
	interval(ProbeNCCLAllReduce, LibNCCL, "ncclAllReduce", "nccl_all_reduce", false),
	interval(ProbeNCCLBroadcast, LibNCCL, "ncclBroadcast", "nccl_broadcast", false),
	interval(ProbeNCCLReduce, LibNCCL, "ncclReduce", "nccl_reduce", false),
	interval(ProbeNCCLAllGather, LibNCCL, "ncclAllGather", "nccl_all_gather", false),
	interval(ProbeNCCLReduceScatter, LibNCCL, "ncclReduceScatter", "nccl_reduce_scatter", false),
	interval(ProbeNCCLSend, LibNCCL, "ncclSend", "nccl_send", false),
	interval(ProbeNCCLRecv, LibNCCL, "ncclRecv", "nccl_recv", false),
	interval(ProbeNCCLAllToAll, LibNCCL, "ncclAlltoAll", "nccl_all_to_all", true), // NCCL 2.28+
	interval(ProbeNCCLAllToAll, LibNCCL, "ncclAllToAll", "nccl_all_to_all", true), // RCCL
	interval(ProbeNCCLBcast, LibNCCL, "ncclBcast", "nccl_bcast", true),
	interval(ProbeNCCLGather, LibNCCL, "ncclGather", "nccl_gather", true),
	interval(ProbeNCCLScatter, LibNCCL, "ncclScatter", "nccl_scatter", true),
	{ID: ProbeNCCLGroupStart, Kind: LibNCCL, Symbol: "ncclGroupStart", Entry: "nccl_group_start_entry"},
	interval(ProbeNCCLGroupEnd, LibNCCL, "ncclGroupEnd", "nccl_group_end", false),
	interval(ProbeNCCLCommInitRank, LibNCCL, "ncclCommInitRank", "nccl_comm_init_rank", false),
	interval(ProbeNCCLCommInitRankConfig, LibNCCL, "ncclCommInitRankConfig", "nccl_comm_init_rank_config", true), // 2.14+
	interval(ProbeNCCLCommInitAll, LibNCCL, "ncclCommInitAll", "nccl_comm_init_all", true),
	interval(ProbeNCCLCommSplit, LibNCCL, "ncclCommSplit", "nccl_comm_split", true),                                    // 2.18+
	interval(ProbeNCCLCommInitRankScalable, LibNCCL, "ncclCommInitRankScalable", "nccl_comm_init_rank_scalable", true), // 2.23+

	interval(ProbeCUDADeviceSynchronize, LibCUDART, "cudaDeviceSynchronize", "cuda_device_synchronize", false),
	interval(ProbeCUDAStreamSynchronize, LibCUDART, "cudaStreamSynchronize", "cuda_stream_synchronize", false),
	interval(ProbeCUDAEventSynchronize, LibCUDART, "cudaEventSynchronize", "cuda_event_synchronize", false),
	interval(ProbeCuCtxSynchronize, LibCUDA, "cuCtxSynchronize", "cu_ctx_synchronize", false),
	interval(ProbeCuStreamSynchronize, LibCUDA, "cuStreamSynchronize", "cu_stream_synchronize", false),
	interval(ProbeCuEventSynchronize, LibCUDA, "cuEventSynchronize", "cu_event_synchronize", false),

	torch(ProbeTorchNCCLAllreduce, "c10d::ProcessGroupNCCL::allreduce", "torch_nccl_allreduce", 1),
	torch(ProbeTorchNCCLAllreduceCoalesced, "c10d::ProcessGroupNCCL::allreduce_coalesced", "torch_nccl_allreduce_coalesced", 1),
	torch(ProbeTorchNCCLBroadcast, "c10d::ProcessGroupNCCL::broadcast", "torch_nccl_broadcast", 1),
	torch(ProbeTorchNCCLReduce, "c10d::ProcessGroupNCCL::reduce", "torch_nccl_reduce", 1),
	torch(ProbeTorchNCCLAllgather, "c10d::ProcessGroupNCCL::allgather", "torch_nccl_allgather", 1),
	torch(ProbeTorchNCCLAllgatherBase, "c10d::ProcessGroupNCCL::_allgather_base", "torch_nccl_allgather_base", 1),
	torch(ProbeTorchNCCLAllgatherCoalesced, "c10d::ProcessGroupNCCL::allgather_into_tensor_coalesced", "torch_nccl_allgather_coalesced", 1),
	torch(ProbeTorchNCCLReduceScatter, "c10d::ProcessGroupNCCL::reduce_scatter", "torch_nccl_reduce_scatter", 1),
	torch(ProbeTorchNCCLReduceScatterBase, "c10d::ProcessGroupNCCL::_reduce_scatter_base", "torch_nccl_reduce_scatter_base", 1),
	torch(ProbeTorchNCCLReduceScatterCoalesced, "c10d::ProcessGroupNCCL::reduce_scatter_tensor_coalesced", "torch_nccl_reduce_scatter_coalesced", 1),
	torch(ProbeTorchNCCLAlltoall, "c10d::ProcessGroupNCCL::alltoall", "torch_nccl_alltoall", 1),
	torch(ProbeTorchNCCLAlltoallBase, "c10d::ProcessGroupNCCL::alltoall_base", "torch_nccl_alltoall_base", 1),
	torch(ProbeTorchNCCLBarrier, "c10d::ProcessGroupNCCL::barrier", "torch_nccl_barrier", 1),
	torch(ProbeTorchNCCLSend, "c10d::ProcessGroupNCCL::send", "torch_nccl_send", 1),
	torch(ProbeTorchNCCLRecv, "c10d::ProcessGroupNCCL::recv", "torch_nccl_recv", 1),
	torch(ProbeTorchNCCLWorkWait, "c10d::ProcessGroupNCCL::WorkNCCL::wait", "torch_nccl_work_wait", 0),
	torch(ProbeTorchGlooAllreduce, "c10d::ProcessGroupGloo::allreduce", "torch_gloo_allreduce", 1),
	torch(ProbeTorchGlooAllreduceCoalesced, "c10d::ProcessGroupGloo::allreduce_coalesced", "torch_gloo_allreduce_coalesced", 1),
	torch(ProbeTorchGlooBroadcast, "c10d::ProcessGroupGloo::broadcast", "torch_gloo_broadcast", 1),
	torch(ProbeTorchGlooReduce, "c10d::ProcessGroupGloo::reduce", "torch_gloo_reduce", 1),
	torch(ProbeTorchGlooAllgather, "c10d::ProcessGroupGloo::allgather", "torch_gloo_allgather", 1),
	torch(ProbeTorchGlooAllgatherBase, "c10d::ProcessGroupGloo::_allgather_base", "torch_gloo_allgather_base", 1),
	torch(ProbeTorchGlooAllgatherCoalesced, "c10d::ProcessGroupGloo::allgather_into_tensor_coalesced", "torch_gloo_allgather_coalesced", 1),
	torch(ProbeTorchGlooReduceScatter, "c10d::ProcessGroupGloo::reduce_scatter", "torch_gloo_reduce_scatter", 1),
	torch(ProbeTorchGlooReduceScatterBase, "c10d::ProcessGroupGloo::_reduce_scatter_base", "torch_gloo_reduce_scatter_base", 1),
	torch(ProbeTorchGlooReduceScatterCoalesced, "c10d::ProcessGroupGloo::reduce_scatter_tensor_coalesced", "torch_gloo_reduce_scatter_coalesced", 1),
	torch(ProbeTorchGlooAlltoall, "c10d::ProcessGroupGloo::alltoall", "torch_gloo_alltoall", 1),
	torch(ProbeTorchGlooAlltoallBase, "c10d::ProcessGroupGloo::alltoall_base", "torch_gloo_alltoall_base", 1),
	torch(ProbeTorchGlooBarrier, "c10d::ProcessGroupGloo::barrier", "torch_gloo_barrier", 1),
	torch(ProbeTorchGlooSend, "c10d::ProcessGroupGloo::send", "torch_gloo_send", 1),
	torch(ProbeTorchGlooRecv, "c10d::ProcessGroupGloo::recv", "torch_gloo_recv", 1),
	torch(ProbeTorchWorkWait, "c10d::Work::wait", "torch_work_wait", 0),
	// The host wait of DDP: the reducer does not call Work::wait but waits on
	// each bucket's future (work->getFuture(); Reducer::finalize_backward:
	// bucket.future_work->wait()), c10::ivalue::Future::wait() in torch 2.x
	// (_ZN3c106ivalue6Future4waitEv, `this` in rdi). It is an inline member
	// of the exported class (C10_EXPORT ivalue::Future, ivalue_inl.h), so
	// what is probed is the out-of-line copy a library exports; call sites
	// that inlined it are not seen. Future::wait is generic (RPC, jit fork,
	// torch.futures): the agent counts it as a collective wait only in
	// processes that issue torch collectives (agent/convert.go).
	// waitAndThrow() is not probed: its callers are RPC, distributed
	// autograd and collectAll, not the collectives of a training step.
	// Measured: torch 2.11's libtorch_cpu.so and libtorch_python.so export
	// no copy (nm -D finds none; bench/results/raw/gpu-doctor-and-symbols.txt),
	// so on that build the probe does not attach and gloo DDP victims' waits
	// stay in host. The fake libtorch exports it, which is what the
	// integration test covers.
	torch(ProbeTorchFutureWait, "c10::ivalue::Future::wait", "torch_future_wait", 0),

	{ID: ProbeCUPTIEmit, Kind: LibCUPTI, Symbol: CUPTIEmitSymbol, Entry: "cupti_emit_entry", RefCtr: CUPTISemaphoreSymbol},

	// libcupti's entry points, entry only: a call from any thread but the
	// injection library's control thread is another CUPTI client (Kineto,
	// nsys) starting or ending a session; the injection library yields to
	// it (agent/cuptiyield.go). Rare calls: a few per session, and the
	// library's own toggles.
	cuptiCall(ProbeCUPTISubscribe, "cuptiSubscribe", "cupti_subscribe"),
	cuptiCall(ProbeCUPTIRegisterCallbacks, "cuptiActivityRegisterCallbacks", "cupti_register_callbacks"),
	cuptiCall(ProbeCUPTIRegisterTimestamp, "cuptiActivityRegisterTimestampCallback", "cupti_register_timestamp"),
	cuptiCall(ProbeCUPTIEnable, "cuptiActivityEnable", "cupti_enable"),
	cuptiCall(ProbeCUPTIDisable, "cuptiActivityDisable", "cupti_disable"),
	cuptiCall(ProbeCUPTIFlushAll, "cuptiActivityFlushAll", "cupti_flush_all"),
	cuptiCall(ProbeCUPTIFinalize, "cuptiFinalize", "cupti_finalize"),
}

func cuptiCall(id ProbeID, sym, prog string) ProbeSpec {
	return ProbeSpec{ID: id, Kind: LibCUPTIRuntime, Symbol: sym, Entry: prog + "_entry", Optional: true}
}

// Specs returns a copy of the probe table.
func Specs() []ProbeSpec { return append([]ProbeSpec(nil), specs...) }

// probeInfo is what the decoder needs to know about a probe id.
type probeInfo struct {
	name    string
	typ     EventType
	selfArg int
}

var probeInfos = func() map[ProbeID]probeInfo {
	m := make(map[ProbeID]probeInfo, len(specs))
	for _, s := range specs {
		if _, ok := m[s.ID]; ok {
			continue // alternate spelling of the same probe: first name wins
		}
		m[s.ID] = probeInfo{name: s.Name(), typ: eventTypeOf(s.ID), selfArg: s.SelfArg}
	}
	return m
}()

// eventTypeOf maps a probe id range to the record type its programs emit.
func eventTypeOf(id ProbeID) EventType {
	switch {
	case id >= 1 && id <= 19:
		return EventColl
	case id == ProbeNCCLGroupStart || id == ProbeNCCLGroupEnd:
		return EventGroup
	case id >= 30 && id <= 39:
		return EventCommInit
	case id >= 40 && id <= 59:
		return EventSync
	case id >= 100 && id <= 199:
		return EventTorch
	case id == ProbeCUPTIEmit:
		return EventBatch
	case id >= 210 && id <= 229:
		return EventCUPTICall
	}
	return 0
}

func (p ProbeID) String() string {
	if info, ok := probeInfos[p]; ok {
		return info.name
	}
	return fmt.Sprintf("ProbeID(%d)", uint32(p))
}

// EventType is the type of record this probe emits, 0 for unknown ids.
func (p ProbeID) EventType() EventType {
	if info, ok := probeInfos[p]; ok {
		return info.typ
	}
	return 0
}
