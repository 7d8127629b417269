package capture

import "github.com/slowrank/slowrank/bpf"

// CUPTICall is one call into libcupti seen by a uprobe. Convert passes it
// on as a pipeline.OtherInput for the agent, which follows another CUPTI
// client with it (its yield); the pipeline never sees it.
type CUPTICall struct {
	PID, TID uint32
	// Fn is the function: the probe that saw the call (bpf.ProbeCUPTIEnable,
	// ...; the bpf.ClassCUPTICall probes).
	Fn     bpf.ProbeID
	Arg    uint64 // first argument (activity kind, flush flags, request callback)
	Arg2   uint64 // second argument (completion callback)
	TimeNs int64  // CLOCK_MONOTONIC
}
