// Package cupti owns slowrank's device-side data path: the CUPTI injection
// library libslowrank_cupti.so (C, in this directory, built by cupti.mk),
// the batch ABI it emits (slowrank_abi.h, which bpf/ may include), and the Go
// decoder of those batches. It imports no other slowrank package.
//
// # The NCCL profiler plugin
//
// The same library is NCCL's profiler plugin (NCCL_PROFILER_PLUGIN pointing at
// the same file; ncclProfiler_v6 for NCCL 2.29 and 2.30, ncclProfiler_v5 for
// 2.28, ncclProfiler_v4 for 2.27; slowrank_nccl.c, docs/nccl-profiler-plugin.md). Its records (NCCLComm,
// NCCLColl, NCCLKernel in nccl.go) travel in the same batches. NCCL calls it
// from its user, host-callback and proxy threads; the plugin never allocates,
// locks or blocks there, and drops (counted) when its ring is full. Its
// activation mask is 0 until an agent attaches; kernel-channel (GPU) events
// follow the duty cycle.
//
// # The injection library
//
// The CUDA driver loads the library into each unmodified training process
// through CUDA_INJECTION64_PATH and calls InitializeInjection from cuInit.
// That call never blocks, aborts or fails: it starts one detached, low
// priority control thread and returns. The thread dlopens libcupti (never
// linked: the library loads on any host), searching SLOWRANK_CUPTI_LIB, a
// libcupti already in the process (torch), $CUDA_HOME and /usr/local/cuda
// (extras/CUPTI/lib64, targets/*/lib), the nvidia-cuda-cupti pip package
// beside the loaded libcudart or libtorch_cuda, then the linker path. It
// prints one status line on stderr ("slowrank-cupti: pid N: ready, ...");
// SLOWRANK_CUPTI_DEBUG=1 prints more, SLOWRANK_CUPTI_QUIET=1 nothing,
// SLOWRANK_CUPTI_DISABLE=1 turns the library off.
//
// Until an agent attaches, the library makes no CUPTI call at all: nothing is
// enabled and no buffer is allocated, so an idle library costs a 50 ms poll.
// When an agent attaches, the library probes cuptiSubscribe once (and releases
// the subscription at once) to report whether another client holds CUPTI
// (StatusForeignSubscriber: Kineto keeps the slot from its first profiling
// session on), then makes no CUPTI call until the agent has decided whether
// another client is active (Yield, written with WriteYield; the agent sees
// other clients' calls with uprobes on libcupti). While one is (Kineto,
// nsys), the library makes no CUPTI call (StateYielded), so that client's
// trace is complete; when it is gone the library registers its callbacks and
// clock again and resumes. A CUPTI error (privileges, no driver) sets
// StateRefused until the next attach. To use CUPTI it registers its buffer
// callbacks and, where the libcupti has it,
// cuptiActivityRegisterTimestampCallback returning CLOCK_MONOTONIC, before
// enabling any kind; without it, it calibrates CUPTI's clock against
// CLOCK_MONOTONIC (tightest of 16 brackets, every second) and applies the
// offset. Record timestamps are therefore always CLOCK_MONOTONIC, the clock
// of bpf_ktime_get_ns.
//
// While attached, the library follows the duty cycle of its control block:
// it enables CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, MEMCPY and MEMSET for
// on-phases only (never KIND_KERNEL, which serialises kernels), flushes with
// cuptiActivityFlushAll(0) every 100 ms while collecting, and hands CUPTI
// buffers from a bounded pool (8 x 1 MiB; SLOWRANK_CUPTI_BUFFERS,
// SLOWRANK_CUPTI_BUFFER_KB). An exhausted pool gives CUPTI no buffer, so CUPTI
// drops and counts; both counts travel in every batch header. On detach it
// disables everything, force-flushes and frees the buffers. At exit (atexit
// and the library destructor) it force-flushes and sends a final stats batch,
// waiting at most 300 ms.
//
// # The batch ABI
//
// Each completed CUPTI buffer becomes batches of at most BatchMax (16384)
// bytes, each handed to slowrank_cupti_emit(batch, len): an empty, noinline
// function that the agent uprobes; BPF copies the bytes into the ring buffer.
// A batch is a 64-byte header (magic "SRCB", version, flags, pid, count,
// sequence number in completion order, cumulative CUPTI and library drops,
// length, clock source and offset, control generation) followed by count
// records. Each record starts with {u16 kind, u16 size}, is 8-byte aligned
// and its size covers it whole, so a decoder skips kinds it does not know:
//
//	kernel      72 B  start/end ns, device, context, stream, correlation, grid, block, name id, class
//	memcpy      48 B  start/end ns, bytes, device, context, stream, correlation, copy/src/dst kind
//	memset      48 B  same layout
//	name        16 B + name (<= NameMax = 512 bytes): id, class, full length, truncated flag
//	stats        8 B + 8 B per counter (Stat)
//	transition  16 B  collection on/off at a timestamp, with the reason and mode
//
// Kernel names are interned per process: a name definition is sent once per
// name and attach epoch, in the same batch as and before its first use, and
// again after every attach (or when the agent bumps Duty.NameResend). The
// class (communication, attention, gemm, moe, copy, other) is decided in C
// from the full name when it is interned, and travels in every kernel
// record. DecodeBatch is strict and allocation-bounded; an Interner resolves
// ids per process and falls back to "kernel#<id>".
//
// # The control protocol
//
// Two exported objects steer the library. slowrank_cupti_semaphore is a
// volatile uint16_t in section .probes: attach the uprobe on EmitSymbol with
// ref_ctr_offset = Library.SemaphoreOffset (see InspectLibrary) and the
// kernel raises it while the uprobe is attached; the library collects only
// while it is non-zero and notices changes within 50 ms.
// slowrank_cupti_control (ControlSize bytes, in .data) carries the duty cycle
// written by the agent through /proc/PID/mem (WriteDuty: seqlock on the
// generation; WriteStep for DutySteps) and the library's status (Status:
// state, flags, counters, a heartbeat), read with ReadControl at the address
// ControlAddress computes. Every write reads its block first through the
// same Mem and writes nothing where the magic, version, size or the
// generation last written are not as expected (ErrControl, ErrBlockMoved).
// Without an agent write the library uses
// DefaultDuty (200 ms of every 20 s).
//
// The yield to another CUPTI client (Yield, WriteYield) comes with a hand
// back: Status.HandbackAddr points at the library's slowrank_cupti_handback
// (HandbackSize bytes), where the agent publishes the other client's buffer
// callbacks, clock and kinds as its uprobes saw them (WriteHandback, then
// WriteYield with an advanced generation). A client that registered its
// callbacks as the library took CUPTI gets them back, and its buffers that
// completed to the library, when the library yields (Handback in
// slowrank_abi.h); ReadHandback reports what the library gave back and the
// yields where it could not (HandbackStatus.Taken).
//
// # Requirements
//
// Building needs cupti.h and cuda.h: a CUDA toolkit (11.8 to 13.x; CUDA_HOME,
// default /usr/local/cuda) or Debian 12's libcupti-dev (non-free) plus cuda.h
// from nvidia-cuda-dev, extracted by `make cupti-headers` without installing
// the package. Running needs a CUDA driver and any libcupti from CUDA 11.8 on;
// the record prefixes the library reads are identical in all of them
// (checked at compile time). Only one CUPTI activity client per process works:
// while torch.profiler (Kineto) or nsys owns CUPTI, the library backs off or
// loses its buffers to them.
//
// # Concurrency
//
// The Go API is pure except ReadControl, WriteDuty, WriteStep, WriteYield,
// ReadHandback, WriteHandback and InspectLibrary, which do the I/O they name. Interner is safe for
// concurrent use; the decoding functions keep no state.
package cupti
