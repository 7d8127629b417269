// Package agent is the host agent's core: it finds the training processes
// of a host, attaches the uprobes and the injection library to them, turns
// what they report into correlate's records and runs them through the
// pipeline to the sinks, under one overhead budget.
//
// It owns:
//   - the life cycle (New, Run): the main loop, its tick, the shutdown that
//     detaches and settles the last window (agent.go), and the resource
//     bounds (limits.go);
//   - the process attacher: following the processes agent/discover
//     reports, attaching each to the per-inode attach manager of
//     agent/attach (attacher.go, probeset.go), the injection library's
//     control block through /proc/PID/mem (procmem.go) and the yield to
//     another CUPTI client (cuptiyield.go);
//   - the reader goroutine that hands BPF events to agent/capture's
//     converter and its records to agent/pipeline;
//   - device-collection control: feeding agent/duty's overhead ledger and
//     applying its duty plan (dutyplan.go), and the GPU placement that
//     agent/gpu's NVML evidence finds;
//   - control and status: runtime control (control.go), the counters every
//     drop is reported in (counters.go) and the state that status and the
//     local API read (status.go, observe.go, localapi.go, served by
//     agent/localapi).
//
// Elsewhere: which processes are ranks and what they map is
// agent/discover's; the conversion into correlate's records, with the NCCL
// dual capture path, agent/capture's; the overhead ledger agent/duty's;
// NVML agent/gpu's; capabilities and kernel checks agent/privilege's
// (doctor uses the same); correlation and the detector run in
// agent/pipeline. None of them imports agent.
//
// Concurrency: one main goroutine (Run's loop) owns the attacher, the duty
// plan and the pipeline; the process watcher, the ring buffer reader
// (which runs agent/capture's converter) and the NVML sampler run in their
// own goroutines and hand
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
