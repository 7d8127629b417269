package bpf

import (
	"path/filepath"
	"strings"
)

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
// run, what a missing symbol means, and what its calls are (Class, Op). One
// generic mechanism (AttachLibrary) handles every spec, and the agent
// converts every record by its probe's class and op.
type ProbeSpec struct {
	ID ProbeID
	// Class says what the calls are; it decides the record type the
	// programs emit (ProbeClass.EventType).
	Class ProbeClass
	// Op is what a call does, in correlate's vocabulary (correlate.Op): the
	// collective of a collective ("allreduce", "reducescatter", ...), the
	// function's name for a synchronisation; empty for the other classes.
	Op   string
	Kind LibKind
	// Symbol is the exact ELF symbol (C functions).
	Symbol string
	// Qualified is a C++ qualified name ("c10d::ProcessGroupNCCL::allreduce")
	// matched against the Itanium-mangled symbol prefix, every overload.
	Qualified string
	// Entry and Return are the names in slowrank.bpf.c of the function's own
	// programs, which perf-event uprobes run; Return is empty for entry-only
	// probes. uprobe_multi links run the class's shared programs instead
	// (multiPrograms), which read the probe id and Layout from the attach
	// cookie.
	Entry, Return string
	// Layout is how the programs read the arguments (the shape macro's
	// layout in slowrank.bpf.c).
	Layout Layout
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

// interval is a probe of a C function with an entry and a return program.
func interval(id ProbeID, class ProbeClass, kind LibKind, sym, prog string, layout Layout, optional bool) ProbeSpec {
	return ProbeSpec{ID: id, Class: class, Kind: kind, Symbol: sym, Entry: prog + "_entry", Return: prog + "_return",
		Layout: layout, Optional: optional}
}

// coll is an NCCL collective or point-to-point call doing op.
func coll(id ProbeID, sym, prog, op string, layout Layout, optional bool) ProbeSpec {
	s := interval(id, ClassCollective, LibNCCL, sym, prog, layout, optional)
	s.Op = op
	return s
}

// commInit is a communicator creation.
func commInit(id ProbeID, sym, prog string, layout Layout, optional bool) ProbeSpec {
	return interval(id, ClassCommInit, LibNCCL, sym, prog, layout, optional)
}

// syncWait is a device synchronisation. Its op is the function's name: step
// detection tells the synchronisations of a loop apart by it.
func syncWait(id ProbeID, kind LibKind, sym, prog string, layout Layout) ProbeSpec {
	s := interval(id, ClassSyncWait, kind, sym, prog, layout, false)
	s.Op = sym
	return s
}

// torchColl is a c10d ProcessGroup collective doing op. It returns a
// c10::intrusive_ptr<Work> through a hidden pointer, so `this` is in rsi.
func torchColl(id ProbeID, qualified, prog, op string) ProbeSpec {
	s := torchMethod(id, ClassTorchCollective, qualified, prog)
	s.Op, s.SelfArg = op, 1
	return s
}

// torchMethod is an optional torch C++ method, `this` in rdi.
func torchMethod(id ProbeID, class ProbeClass, qualified, prog string) ProbeSpec {
	return ProbeSpec{ID: id, Class: class, Kind: LibTorch, Qualified: qualified, Entry: prog + "_entry",
		Return: prog + "_return", Layout: LayoutTorch, Optional: true}
}

// specs is the probe table. Required (non-optional) symbols exist in every
// NCCL >= 2.7 and CUDA >= 11.
var specs = []ProbeSpec{
	coll(ProbeNCCLAllReduce, "ncclAllReduce", "nccl_all_reduce", "allreduce", LayoutCollOp7, false),
	coll(ProbeNCCLBroadcast, "ncclBroadcast", "nccl_broadcast", "broadcast", LayoutCollRoot7, false),
	coll(ProbeNCCLReduce, "ncclReduce", "nccl_reduce", "reduce", LayoutCollReduce8, false),
	coll(ProbeNCCLAllGather, "ncclAllGather", "nccl_all_gather", "allgather", LayoutCollPlain6, false),
	coll(ProbeNCCLReduceScatter, "ncclReduceScatter", "nccl_reduce_scatter", "reducescatter", LayoutCollOp7, false),
	coll(ProbeNCCLSend, "ncclSend", "nccl_send", "send", LayoutCollPeer6, false),
	coll(ProbeNCCLRecv, "ncclRecv", "nccl_recv", "recv", LayoutCollPeer6, false),
	coll(ProbeNCCLAllToAll, "ncclAlltoAll", "nccl_all_to_all", "alltoall", LayoutCollPlain6, true), // NCCL 2.28+
	coll(ProbeNCCLAllToAll, "ncclAllToAll", "nccl_all_to_all", "alltoall", LayoutCollPlain6, true), // RCCL
	coll(ProbeNCCLBcast, "ncclBcast", "nccl_bcast", "broadcast", LayoutCollPeer6, true),
	coll(ProbeNCCLGather, "ncclGather", "nccl_gather", "gather", LayoutCollRoot7, true),
	coll(ProbeNCCLScatter, "ncclScatter", "nccl_scatter", "scatter", LayoutCollRoot7, true),
	{ID: ProbeNCCLGroupStart, Class: ClassGroup, Kind: LibNCCL, Symbol: "ncclGroupStart", Entry: "nccl_group_start_entry", Layout: LayoutGroupStart},
	interval(ProbeNCCLGroupEnd, ClassGroup, LibNCCL, "ncclGroupEnd", "nccl_group_end", LayoutGroupEnd, false),
	commInit(ProbeNCCLCommInitRank, "ncclCommInitRank", "nccl_comm_init_rank", LayoutInitRank, false),
	commInit(ProbeNCCLCommInitRankConfig, "ncclCommInitRankConfig", "nccl_comm_init_rank_config", LayoutInitRank, true), // 2.14+
	commInit(ProbeNCCLCommInitAll, "ncclCommInitAll", "nccl_comm_init_all", LayoutInitAll, true),
	commInit(ProbeNCCLCommSplit, "ncclCommSplit", "nccl_comm_split", LayoutSplit, true),                                           // 2.18+
	commInit(ProbeNCCLCommInitRankScalable, "ncclCommInitRankScalable", "nccl_comm_init_rank_scalable", LayoutInitScalable, true), // 2.23+

	syncWait(ProbeCUDADeviceSynchronize, LibCUDART, "cudaDeviceSynchronize", "cuda_device_synchronize", LayoutSync),
	syncWait(ProbeCUDAStreamSynchronize, LibCUDART, "cudaStreamSynchronize", "cuda_stream_synchronize", LayoutSyncHandle),
	syncWait(ProbeCUDAEventSynchronize, LibCUDART, "cudaEventSynchronize", "cuda_event_synchronize", LayoutSyncHandle),
	syncWait(ProbeCuCtxSynchronize, LibCUDA, "cuCtxSynchronize", "cu_ctx_synchronize", LayoutSync),
	syncWait(ProbeCuStreamSynchronize, LibCUDA, "cuStreamSynchronize", "cu_stream_synchronize", LayoutSyncHandle),
	syncWait(ProbeCuEventSynchronize, LibCUDA, "cuEventSynchronize", "cu_event_synchronize", LayoutSyncHandle),

	torchColl(ProbeTorchNCCLAllreduce, "c10d::ProcessGroupNCCL::allreduce", "torch_nccl_allreduce", "allreduce"),
	torchColl(ProbeTorchNCCLAllreduceCoalesced, "c10d::ProcessGroupNCCL::allreduce_coalesced", "torch_nccl_allreduce_coalesced", "allreduce"),
	torchColl(ProbeTorchNCCLBroadcast, "c10d::ProcessGroupNCCL::broadcast", "torch_nccl_broadcast", "broadcast"),
	torchColl(ProbeTorchNCCLReduce, "c10d::ProcessGroupNCCL::reduce", "torch_nccl_reduce", "reduce"),
	torchColl(ProbeTorchNCCLAllgather, "c10d::ProcessGroupNCCL::allgather", "torch_nccl_allgather", "allgather"),
	torchColl(ProbeTorchNCCLAllgatherBase, "c10d::ProcessGroupNCCL::_allgather_base", "torch_nccl_allgather_base", "allgather"),
	torchColl(ProbeTorchNCCLAllgatherCoalesced, "c10d::ProcessGroupNCCL::allgather_into_tensor_coalesced", "torch_nccl_allgather_coalesced", "allgather"),
	torchColl(ProbeTorchNCCLReduceScatter, "c10d::ProcessGroupNCCL::reduce_scatter", "torch_nccl_reduce_scatter", "reducescatter"),
	torchColl(ProbeTorchNCCLReduceScatterBase, "c10d::ProcessGroupNCCL::_reduce_scatter_base", "torch_nccl_reduce_scatter_base", "reducescatter"),
	torchColl(ProbeTorchNCCLReduceScatterCoalesced, "c10d::ProcessGroupNCCL::reduce_scatter_tensor_coalesced", "torch_nccl_reduce_scatter_coalesced", "reducescatter"),
	torchColl(ProbeTorchNCCLAlltoall, "c10d::ProcessGroupNCCL::alltoall", "torch_nccl_alltoall", "alltoall"),
	torchColl(ProbeTorchNCCLAlltoallBase, "c10d::ProcessGroupNCCL::alltoall_base", "torch_nccl_alltoall_base", "alltoall"),
	torchColl(ProbeTorchNCCLBarrier, "c10d::ProcessGroupNCCL::barrier", "torch_nccl_barrier", "barrier"),
	torchColl(ProbeTorchNCCLSend, "c10d::ProcessGroupNCCL::send", "torch_nccl_send", "send"),
	torchColl(ProbeTorchNCCLRecv, "c10d::ProcessGroupNCCL::recv", "torch_nccl_recv", "recv"),
	torchMethod(ProbeTorchNCCLWorkWait, ClassTorchWorkWait, "c10d::ProcessGroupNCCL::WorkNCCL::wait", "torch_nccl_work_wait"),
	torchColl(ProbeTorchGlooAllreduce, "c10d::ProcessGroupGloo::allreduce", "torch_gloo_allreduce", "allreduce"),
	torchColl(ProbeTorchGlooAllreduceCoalesced, "c10d::ProcessGroupGloo::allreduce_coalesced", "torch_gloo_allreduce_coalesced", "allreduce"),
	torchColl(ProbeTorchGlooBroadcast, "c10d::ProcessGroupGloo::broadcast", "torch_gloo_broadcast", "broadcast"),
	torchColl(ProbeTorchGlooReduce, "c10d::ProcessGroupGloo::reduce", "torch_gloo_reduce", "reduce"),
	torchColl(ProbeTorchGlooAllgather, "c10d::ProcessGroupGloo::allgather", "torch_gloo_allgather", "allgather"),
	torchColl(ProbeTorchGlooAllgatherBase, "c10d::ProcessGroupGloo::_allgather_base", "torch_gloo_allgather_base", "allgather"),
	torchColl(ProbeTorchGlooAllgatherCoalesced, "c10d::ProcessGroupGloo::allgather_into_tensor_coalesced", "torch_gloo_allgather_coalesced", "allgather"),
	torchColl(ProbeTorchGlooReduceScatter, "c10d::ProcessGroupGloo::reduce_scatter", "torch_gloo_reduce_scatter", "reducescatter"),
	torchColl(ProbeTorchGlooReduceScatterBase, "c10d::ProcessGroupGloo::_reduce_scatter_base", "torch_gloo_reduce_scatter_base", "reducescatter"),
	torchColl(ProbeTorchGlooReduceScatterCoalesced, "c10d::ProcessGroupGloo::reduce_scatter_tensor_coalesced", "torch_gloo_reduce_scatter_coalesced", "reducescatter"),
	torchColl(ProbeTorchGlooAlltoall, "c10d::ProcessGroupGloo::alltoall", "torch_gloo_alltoall", "alltoall"),
	torchColl(ProbeTorchGlooAlltoallBase, "c10d::ProcessGroupGloo::alltoall_base", "torch_gloo_alltoall_base", "alltoall"),
	torchColl(ProbeTorchGlooBarrier, "c10d::ProcessGroupGloo::barrier", "torch_gloo_barrier", "barrier"),
	torchColl(ProbeTorchGlooSend, "c10d::ProcessGroupGloo::send", "torch_gloo_send", "send"),
	torchColl(ProbeTorchGlooRecv, "c10d::ProcessGroupGloo::recv", "torch_gloo_recv", "recv"),
	torchMethod(ProbeTorchWorkWait, ClassTorchWorkWait, "c10d::Work::wait", "torch_work_wait"),
	// The host wait of DDP: the reducer does not call Work::wait but waits on
	// each bucket's future (work->getFuture(); Reducer::finalize_backward:
	// bucket.future_work->wait()), c10::ivalue::Future::wait() in torch 2.x
	// (_ZN3c106ivalue6Future4waitEv, `this` in rdi). It is an inline member
	// of the exported class (C10_EXPORT ivalue::Future, ivalue_inl.h), so
	// what is probed is the out-of-line copy a library exports; call sites
	// that inlined it are not seen. Future::wait is generic (RPC, jit fork,
	// torch.futures): the agent counts it as a collective wait only in
	// processes that issue torch collectives (agent/capture/convert.go).
	// waitAndThrow() is not probed: its callers are RPC, distributed
	// autograd and collectAll, not the collectives of a training step.
	// Measured: torch 2.11's libtorch_cpu.so and libtorch_python.so export
	// no copy (nm -D finds none; bench/results/raw/gpu-doctor-and-symbols.txt),
	// so on that build the probe does not attach and gloo DDP victims' waits
	// stay in host. The fake libtorch exports it, which is what the
	// integration test covers.
	torchMethod(ProbeTorchFutureWait, ClassTorchFutureWait, "c10::ivalue::Future::wait", "torch_future_wait"),

	{ID: ProbeCUPTIEmit, Class: ClassCUPTIBatch, Kind: LibCUPTI, Symbol: CUPTIEmitSymbol, Entry: "cupti_emit_entry", Layout: LayoutCUPTIEmit, RefCtr: CUPTISemaphoreSymbol},

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
	return ProbeSpec{ID: id, Class: ClassCUPTICall, Kind: LibCUPTIRuntime, Symbol: sym, Entry: prog + "_entry", Layout: LayoutCUPTICall, Optional: true}
}

// multiProgram are the programs a class's uprobe_multi links run, shared by
// all its functions (slowrank.bpf.c, MULTI_INTERVAL); ret is empty for the
// classes without a return probe.
type multiProgram struct{ entry, ret string }

var multiPrograms = map[ProbeClass]multiProgram{
	ClassCollective:      {"multi_coll_entry", "multi_coll_return"},
	ClassGroup:           {"multi_group_entry", "multi_group_return"},
	ClassCommInit:        {"multi_init_entry", "multi_init_return"},
	ClassSyncWait:        {"multi_sync_entry", "multi_sync_return"},
	ClassTorchCollective: {"multi_torch_entry", "multi_torch_return"},
	ClassTorchWorkWait:   {"multi_torch_entry", "multi_torch_return"},
	ClassTorchFutureWait: {"multi_torch_entry", "multi_torch_return"},
	ClassCUPTIBatch:      {"multi_cupti_emit_entry", ""},
	ClassCUPTICall:       {"multi_cupti_call_entry", ""},
}

// Specs returns a copy of the probe table.
func Specs() []ProbeSpec { return append([]ProbeSpec(nil), specs...) }
