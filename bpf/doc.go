// Package bpf owns slowrank's kernel side: the eBPF uprobe programs
// (slowrank.bpf.c), the one header that defines every record crossing from
// BPF to Go (events.h), the bpf2go output generated from them, and the Go
// code that loads the programs, attaches them to libraries, filters processes
// and decodes the ring buffer into typed events.
//
// # What it records
//
// NCCL collective and point-to-point calls, ncclGroupStart/End, communicator
// creation (nranks, rank, a hash of the ncclUniqueId, the new ncclComm_t,
// ncclCommSplit parent/color/key), device synchronisation waits in libcudart
// and libcuda, torch c10d ProcessGroupNCCL/ProcessGroupGloo methods, and the
// opaque CUPTI batches that the injection library passes to
// slowrank_cupti_emit. Entry and return are joined in BPF per (thread, probe)
// so one interval record leaves per call, tagged with the kernel pid (tgid)
// and tid and CLOCK_MONOTONIC times (bpf_ktime_get_ns). Only processes added
// with Track are recorded. Probes are data: see Specs.
//
// # Links
//
// Where the kernel has uprobe_multi links (6.6+), a library gets one link per
// probe class and direction (entry, return) carrying all the class's
// functions; shared programs (multi_*) read each function's probe id and
// argument layout from its attach cookie. A class whose shared link cannot
// be made is attached function by function. Elsewhere, or with
// Options.SingleUprobes, each function gets perf-event uprobes running its
// own programs. Few links matter when the agent dies: the kernel releases a
// dead process's links one after another, each after a few RCU grace
// periods (docs/internals.md, "A killed agent").
//
// # Life cycle and close order
//
//	p, _ := Load(Options{})              // programs, maps
//	r, _ := p.NewReader()                // the one ring buffer consumer
//	a, _ := p.AttachLibrary(src, kind)   // once per (dev, inode), PID 0
//	p.Track(pid, rank)                   // per training process
//	for { ev, err := r.Read(); ... }
//
// Close in this order: Reader (unblocks Read), Attachments (detach uprobes;
// the CUPTI semaphore returns to 0), then Probes. Probes.Close does all three
// in that order for whatever is still open.
//
// # Concurrency
//
// Probes methods (AttachLibrary, Track, Untrack, Stats, NewReader, Close) are
// safe for concurrent use. Reader.Read must be called from one goroutine at a
// time; Reader.Close and SetDeadline may be called from any goroutine. Decode
// is pure. The BPF side never blocks the traced thread: when the ring buffer
// is full a record is dropped and counted (Stats.RingBufFull). BPF does not
// wake the reader per record (that costs the traced call an irq_work, often
// an IPI); it wakes it once Options.WakeupBytes are pending, and Read polls
// every Options.PollInterval (default 20 ms), which bounds the latency.
//
// # Requirements
//
// x86-64 (arguments are read per the SysV ABI). Linux 5.8+ for the BPF ring
// buffer (and bpf_probe_read_user, 5.5+), uprobes (CONFIG_UPROBE_EVENTS;
// perf uprobe PMU or tracefs), uprobe ref_ctr_offset (4.20+) for the CUPTI
// semaphore; uprobe_multi links and attach cookies (6.6+) where used. Root, or CAP_BPF + CAP_PERFMON (+ CAP_SYS_RESOURCE before
// 5.11). Missing support is reported as ErrNotSupported, missing privileges
// as ErrPermission; CheckSupport says which.
//
// # Generating
//
// `go generate ./bpf/...` (or `make bpf-generate` from bpf/bpf.mk, which
// pins clang-14 and llvm-strip-14) rebuilds slowrank_x86_bpfel.{go,o}. The
// output is byte-for-byte reproducible and committed; CI regenerates and runs
// `git diff --exit-code`.
package bpf
