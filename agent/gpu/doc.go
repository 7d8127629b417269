// Package gpu owns what the agent learns from NVML: which GPU each process
// trains on and what that GPU did, as evidence next to a verdict.
//
//   - NVML (nvml*.go): OpenNVML loads libnvidia-ml.so.1 at that call
//     (dlopen), not at program start; without it, without a loaded driver
//     or in a build without cgo it fails with ErrNVMLUnavailable, and the
//     agent runs without GPU evidence. GPUProcesses lists the compute
//     contexts per host PID, Sample reads each GPU's clocks, power,
//     temperature, throttle reasons and error counters.
//   - Evidence (evidence.go): samples NVML once a period on its own
//     goroutine (Run) into a bounded history per GPU (10 minutes), and
//     answers, for a rank's process, the GPU it trains on (Placement: the
//     one holding most of its memory, none when NVML cannot tell) and a
//     summary of its GPU over a window (ForPID). Evidence is never a
//     root-cause claim: the detector's verdicts stand without it.
//
// Concurrency: NVML's methods and Evidence's are safe from any goroutine
// (Evidence keeps its history under a mutex); Close after the last call.
//
// Requirements: an NVIDIA driver for anything but ErrNVMLUnavailable; no
// privileges beyond reading /dev/nvidia* (NVML may hide other users'
// processes' memory: MemoryUnknown).
//
// It imports only detector, agent/identity and internal/monoclock
// (depguard in .golangci.yml): the agent imports it, never the other way
// round.
package gpu
