package gpu

import "errors"

// ErrNVMLUnavailable is matched (errors.Is) by the error of OpenNVML when NVML cannot be
// used: libnvidia-ml.so.1 is absent (no NVIDIA driver on the host), the driver is not loaded,
// the agent was built without cgo, or nvmlInit failed. The agent runs without NVML; it then
// learns GPU placement from the training processes only.
var ErrNVMLUnavailable = errors.New("nvml unavailable")

// MemoryUnknown is Process.UsedMemory when NVML does not know it (no permission, some
// container setups).
const MemoryUnknown = ^uint64(0)

// Process is a process that holds a compute context on a GPU.
type Process struct {
	PID        int    // in the agent's PID namespace (NVML reports host PIDs)
	GPUIndex   int    // NVML index, which follows PCI bus order, not CUDA_VISIBLE_DEVICES
	UUID       string // "GPU-..."
	UsedMemory uint64 // bytes, or MemoryUnknown
	// PCIBusID is NVML's bus id of the GPU ("00000000:3B:00.0"), "" when
	// NVML did not give it.
	PCIBusID string
}

// Sample is one NVML reading of one GPU. Counters are cumulative; fields
// NVML could not read are zero.
type Sample struct {
	AtNS            int64 // CLOCK_MONOTONIC
	Index           int
	UUID            string
	SMClockMHz      uint32
	SMClockLimitMHz uint32
	PowerMW         uint32
	TempC           uint32
	ThrottleReasons uint64 // nvmlClocksEventReasons bits
	ECCUncorrected  uint64
	PCIeReplays     uint64
}

// throttleNames name the nvmlClocksEventReason bits that say why clocks are
// below their maximum.
var throttleNames = []struct {
	bit  uint64
	name string
}{
	{0x1, "gpu_idle"}, {0x2, "applications_clocks_setting"}, {0x4, "sw_power_cap"},
	{0x8, "hw_slowdown"}, {0x10, "sync_boost"}, {0x20, "sw_thermal_slowdown"},
	{0x40, "hw_thermal_slowdown"}, {0x80, "hw_power_brake_slowdown"}, {0x100, "display_clock_setting"},
}

// ThrottleReasonNames turns reason bits into names, lowest bit first.
func ThrottleReasonNames(bits uint64) []string {
	var out []string
	for _, t := range throttleNames {
		if bits&t.bit != 0 {
			out = append(out, t.name)
		}
	}
	return out
}
