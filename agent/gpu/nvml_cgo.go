//go:build cgo

package gpu

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// NVML is an initialised NVML library. Its methods are safe for concurrent use; Close it once,
// after the last call.
type NVML struct {
	lib nvml.Interface
}

// OpenNVML loads libnvidia-ml.so.1 (dlopen, at this call and not at program start) and
// initialises it. Without the library or a loaded driver it fails at once with an error that
// matches ErrNVMLUnavailable. nvmlInit can take a second or more on hosts without persistence
// mode; open once and keep the NVML.
func OpenNVML() (*NVML, error) { return openNVML(nvml.New()) }

func openNVML(lib nvml.Interface) (*NVML, error) {
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("initialise nvml: %s: %w", nvmlErrorString(ret), ErrNVMLUnavailable)
	}
	return &NVML{lib: lib}, nil
}

// nvmlErrorString describes ret without calling into NVML, which may not be loaded.
func nvmlErrorString(ret nvml.Return) string {
	switch ret {
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		return "libnvidia-ml.so.1 not found"
	case nvml.ERROR_DRIVER_NOT_LOADED:
		return "NVIDIA driver not loaded"
	case nvml.ERROR_NO_PERMISSION:
		return "no permission"
	}
	return fmt.Sprintf("nvml return %d", int32(ret))
}

// Close shuts NVML down.
func (n *NVML) Close() error {
	if ret := n.lib.Shutdown(); ret != nvml.SUCCESS {
		return fmt.Errorf("shut down nvml: %s", nvmlErrorString(ret))
	}
	return nil
}

// GPUProcesses maps each PID that holds a compute context to its GPUs
// (nvmlDeviceGetComputeRunningProcesses on every device). A PID on several GPUs (a stray
// context on GPU 0 is common) lists them by UsedMemory, largest first, so [0] is the GPU it
// trains on. A device that fails to answer is skipped; the error reports the first such.
func (n *NVML) GPUProcesses() (map[int][]Process, error) {
	count, ret := n.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("count nvml devices: %s", nvmlErrorString(ret))
	}
	out := make(map[int][]Process)
	var firstErr error
	fail := func(i int, what string, ret nvml.Return) {
		if firstErr == nil {
			firstErr = fmt.Errorf("nvml device %d: %s: %s", i, what, nvmlErrorString(ret))
		}
	}
	for i := range count {
		dev, ret := n.lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			fail(i, "get handle", ret)
			continue
		}
		uuid, ret := dev.GetUUID()
		if ret != nvml.SUCCESS {
			fail(i, "get uuid", ret)
			continue
		}
		procs, ret := dev.GetComputeRunningProcesses()
		if ret != nvml.SUCCESS {
			fail(i, "get compute processes", ret)
			continue
		}
		bus := ""
		if len(procs) > 0 {
			// Optional: the GPU is named by its UUID without it.
			if pci, ret := dev.GetPciInfo(); ret == nvml.SUCCESS {
				bus = pciBusID(pci)
			}
		}
		for _, p := range procs {
			pid := int(p.Pid)
			out[pid] = append(out[pid], Process{PID: pid, GPUIndex: i, UUID: uuid, UsedMemory: p.UsedGpuMemory, PCIBusID: bus})
		}
	}
	for _, gs := range out {
		slices.SortStableFunc(gs, func(a, b Process) int { return cmp.Compare(knownMemory(b), knownMemory(a)) })
	}
	return out, firstErr
}

// pciBusID is NVML's bus id string ("00000000:3B:00.0", the form that
// dcgm-exporter's pci_bus_id label has): the NUL-terminated BusId field.
func pciBusID(pci nvml.PciInfo) string {
	b := make([]byte, 0, len(pci.BusId))
	for _, c := range pci.BusId {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	return string(b)
}

func knownMemory(g Process) uint64 {
	if g.UsedMemory == MemoryUnknown {
		return 0
	}
	return g.UsedMemory
}

// Sample reads clocks, power, temperature, clock-event reasons, ECC and PCIe
// replay counters of every GPU. A reading NVML refuses is left zero; a
// device that fails to answer at all is skipped.
func (n *NVML) Sample(atNS int64) ([]Sample, error) {
	count, ret := n.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("count nvml devices: %s", nvmlErrorString(ret))
	}
	out := make([]Sample, 0, count)
	for i := range count {
		dev, ret := n.lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			continue
		}
		s := Sample{AtNS: atNS, Index: i}
		s.UUID, _ = dev.GetUUID()
		s.SMClockMHz, _ = dev.GetClockInfo(nvml.CLOCK_SM)
		s.SMClockLimitMHz, _ = dev.GetMaxClockInfo(nvml.CLOCK_SM)
		s.PowerMW, _ = dev.GetPowerUsage()
		s.TempC, _ = dev.GetTemperature(nvml.TEMPERATURE_GPU)
		s.ThrottleReasons, _ = dev.GetCurrentClocksEventReasons()
		s.ECCUncorrected, _ = dev.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC)
		if r, ret := dev.GetPcieReplayCounter(); ret == nvml.SUCCESS && r > 0 {
			s.PCIeReplays = uint64(r)
		}
		out = append(out, s)
	}
	return out, nil
}
