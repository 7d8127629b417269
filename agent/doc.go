// Package agent is the host agent's core: it finds the training processes
// of a host, attaches the uprobes and the injection library to them, turns
// what they report into correlate's records and runs them through the
// pipeline to the sinks, under one overhead budget.
//
// It owns:
//   - the life cycle (New, Run): the main loop, its tick, the shutdown that
//     detaches and settles the last window (agent.go);
//   - following the processes agent/discover reports (the ranks, what
//     they map) and the resource bounds (limits.go);
//   - per-process attachment (attach.go, probeset.go) on the per-inode
//     attach manager of agent/attach;
//   - the conversion of BPF events and injection-library batches into
//     correlate.HostCall, DeviceInterval and topology records (convert*.go,
//     nccl_*.go);
//   - device-collection control: feeding agent/duty's overhead ledger and
//     applying its duty plan (dutyplan.go), the yield to another CUPTI client (cuptiyield.go), and
//     the GPU placement agent/gpu's NVML evidence finds;
//   - the counters every drop is reported in (counters.go) and the state
//     that status and the local API read (status.go, localapi.go, served by
//     agent/localapi).
//
// Elsewhere: which processes are ranks and what they map is
// agent/discover's, capabilities and kernel checks are agent/privilege's
// (doctor uses the same), correlation and the detector run in
// agent/pipeline.
//
// Concurrency: one main goroutine (Run's loop) owns the attach state, the
// converter, the duty plan and the pipeline; the process watcher, the ring
// buffer reader and the NVML sampler run in their own goroutines and hand
// their results to it through channels and a bounded queue
// (pipeline.Queue), whose overflow is counted. Functions that say "Main
// goroutine" must be called from it; Status and the counters are safe from
// any goroutine.
//
// Requirements: Linux with uprobes, root or the capabilities that
// agent/privilege lists; it never writes into a training process except
// the injection library's control and handback blocks through
// /proc/PID/mem, opened once when the process is found (an exec leaves it
// reaching nothing, procmem.go), and it attaches uprobes only to the file a
// process maps (bpf.AttachLibrary opens it through the mapping,
// /proc/PID/map_files, or checks its device and inode).
package agent
