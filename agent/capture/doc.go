// Package capture owns the conversion of what the probes and the injection
// library report into correlate's records: BPF events (collectives,
// synchronisations, group calls, communicator creations, torch c10d calls,
// CUPTI calls) and the library's batches (device intervals, kernel names,
// its counters, and its NCCL profiler-plugin records) become
// correlate.HostCall, DeviceInterval and CommInit inputs for the pipeline.
//
//   - Conversion (convert.go): a Converter per agent, state per process
//     (interned kernel names under MaxInternedNames and its neighbours,
//     open collection periods, batch sequence numbers for lost batches,
//     device latency). Everything dropped, refused or implausible is
//     counted through Config.Count; an event it does not handle is
//     events_unknown, never silently used.
//   - The torch gates (convert.go, Converter.torch): c10d collectives are
//     redundant in a process that calls NCCL directly, and Future::wait is
//     a collective wait only in a process that issued a c10d collective.
//   - The NCCL dual capture path (convert_nccl.go, nccl_commmap.go,
//     nccl_comminit.go), below.
//   - Thread ids across PID namespaces (nstid.go, TIDMap): the library
//     publishes its namespace's ids, the uprobes report the host's.
//   - CUPTICall: a call into libcupti, handed on to the agent, which
//     yields to another CUPTI client with it.
//
// # The NCCL dual capture path
//
// A process's NCCL collectives reach the agent by one of two paths: the
// libnccl uprobes (bpf/, a trap per call, reported in real time) or the
// injection library acting as NCCL's profiler plugin (cupti/slowrank_nccl.c:
// NCCL >= 2.27 dlopens the file NCCL_PROFILER_PLUGIN names, the same file as
// CUDA_INJECTION64_PATH, so NCCL and the CUDA driver share one instance, one
// control thread and one emit; its records travel in the library's batches,
// about 100 ms later). The library turns NCCL's activation mask on only
// while an agent is attached and has asked for the records
// (cupti.Duty.NCCLPlugin, set from Config.NCCLPlugin), and the kernel-channel
// events only in the duty cycle's on-phases (agent/duty, kch.go). With
// Config.NCCLPlugin off the records are counted (nccl_plugin_records_ignored)
// and the uprobes report.
//
// A process is on the plugin path from the first NCCL_COLL record of its
// batches on (the library turns NCCL's mask on only once the agent asked
// for the plugin, so calls between a communicator's creation and the mask
// are the uprobes' alone), else on uprobes. A communicator's NCCL_COMM
// record waits for its first collective, which says which handle it takes
// (nccl_commmap.go); the pipeline reorders the process's inputs from the
// switch on (agent/pipeline/reorder.go). Both may see the same calls around
// the switch: the uprobes report in real time, the plugin a batch (~100 ms)
// later, and the libnccl uprobes stay attached (they trap in every process
// mapping the inode). Each call is counted once by a cut per thread:
//
//   - at the switch, cut[tid] is the end of the last libnccl call (or
//     ncclGroupEnd) the uprobes reported for that thread;
//   - a plugin record whose call started at or before cut[tid] was already
//     reported by the uprobes: dropped (nccl_plugin_records_superseded);
//   - a uprobe collective ending after cut[tid] is the plugin's to report:
//     dropped (nccl_uprobe_events_superseded); one ending at or before it
//     (delivered late) is kept, the plugin's record of it is not;
//   - a uprobe comm init is always kept: the plugin's comm record of it
//     takes its ncclComm_t and feeds no CommInit of its own
//     (nccl_comminit.go).
//
// A thread's calls are sequential, and the plugin's start of a call (its
// CollApi start, or its launch on NCCL 2.27, which happens inside the call
// or at the ncclGroupEnd that follows it) lies within the uprobes' interval
// of that call or of its ncclGroupEnd, so the cut splits the calls exactly.
//
// From NCCL 2.28 ncclAlltoAll, ncclGather and ncclScatter reach the plugin
// as their per-peer Send/Recv tasks, and nothing in the record names the
// collective, while the uprobes report one alltoall/gather/scatter call:
// the same job would change its collectives' tokens at the switch. So a
// process whose uprobes report one of them (perPeer) stays on, or returns
// to, the uprobes path: its later plugin records are withheld
// (nccl_plugin_records_kept_on_uprobes), every uprobe collective is kept,
// and it is never "ready" (PluginReady), so its libnccl file keeps its
// collective uprobes. After a switch the return is exact per thread too:
// superseded[tid] is the end of the thread's last libnccl call whose uprobe
// event was dropped for the plugin; a plugin record starting at or before
// it is fed (the uprobes dropped that call), a later one withheld (the
// uprobes keep it). A process whose first such call comes after its
// collective uprobes were closed is not seen (its calls arrive as sends
// and receives): the full conversion is still open.
//
// The agent's side of the switch: the reorder hold of agent/pipeline
// (reorder.go) feeds a plugin-path process's inputs in end order; the
// attach manager closes a libnccl file's collective uprobes once every
// process mapping it is ready (PluginReady; agent/attach/collectives.go)
// and makes them again when one is not; the duty ledger charges the
// plugin's operations (PluginOps). docs/nccl-profiler-plugin.md has the
// measurements behind these rules.
//
// Concurrency: Convert runs on one goroutine (the agent's ring-buffer
// reader); Forget, PluginReady, NCCLPaths, NameStats and LatencyQuantiles
// may be called from another (the agent's main goroutine), and the state
// they share is under the Converter's mutex. A TIDMap is safe for
// concurrent use. Config.Count is called from the converting goroutine.
//
// Requirements: none for the conversion (its tests run unprivileged);
// TIDMap reads /proc/PID/task/*/status.
//
// It imports agent/pipeline (for its input type), agent/discover (bounded
// proc reads), bpf, cupti and correlate only (depguard in .golangci.yml):
// the agent imports it, never the other way round.
package capture
