package agent

import "errors"

// ErrNVMLUnavailable is matched (errors.Is) by the error of OpenNVML when NVML cannot be
// used: libnvidia-ml.so.1 is absent (no NVIDIA driver on the host), the driver is not loaded,
// the agent was built without cgo, or nvmlInit failed. The agent runs without NVML; it then
// learns GPU placement from the training processes only.
var ErrNVMLUnavailable = errors.New("nvml unavailable")

// MemoryUnknown is GPUProcess.UsedMemory when NVML does not know it (no permission, some
// container setups).
const MemoryUnknown = ^uint64(0)

// GPUProcess is a process that holds a compute context on a GPU.
type GPUProcess struct {
	PID        int    // in the agent's PID namespace (NVML reports host PIDs)
	GPUIndex   int    // NVML index, which follows PCI bus order, not CUDA_VISIBLE_DEVICES
	UUID       string // "GPU-..."
	UsedMemory uint64 // bytes, or MemoryUnknown
}
