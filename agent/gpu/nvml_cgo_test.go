//go:build cgo

package gpu

import (
	"errors"
	"reflect"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

func mockDevice(uuid string, procs []nvml.ProcessInfo, ret nvml.Return) *mock.Device {
	return &mock.Device{
		GetUUIDFunc: func() (string, nvml.Return) { return uuid, nvml.SUCCESS },
		GetComputeRunningProcessesFunc: func() ([]nvml.ProcessInfo, nvml.Return) {
			return procs, ret
		},
		// GPU-0 has no PCI information to give: the bus id is optional.
		GetPciInfoFunc: func() (nvml.PciInfo, nvml.Return) {
			if uuid == "GPU-0" {
				return nvml.PciInfo{}, nvml.ERROR_NOT_SUPPORTED
			}
			var pci nvml.PciInfo
			for i, c := range "00000000:1" + uuid[len(uuid)-1:] + ":00.0" {
				pci.BusId[i] = int8(c)
			}
			return pci, nvml.SUCCESS
		},
	}
}

func TestGPUProcessesMock(t *testing.T) {
	devs := []nvml.Device{
		mockDevice("GPU-0", []nvml.ProcessInfo{{Pid: 10, UsedGpuMemory: 500 << 20}, {Pid: 11, UsedGpuMemory: 500 << 20}, {Pid: 12, UsedGpuMemory: 70 << 30}}, nvml.SUCCESS),
		mockDevice("GPU-1", []nvml.ProcessInfo{{Pid: 10, UsedGpuMemory: 70 << 30}}, nvml.SUCCESS),
		mockDevice("GPU-2", []nvml.ProcessInfo{{Pid: 11, UsedGpuMemory: MemoryUnknown}}, nvml.SUCCESS),
		mockDevice("GPU-3", nil, nvml.ERROR_GPU_IS_LOST),
	}
	shut := false
	lib := &mock.Interface{
		InitFunc:                   func() nvml.Return { return nvml.SUCCESS },
		ShutdownFunc:               func() nvml.Return { shut = true; return nvml.SUCCESS },
		DeviceGetCountFunc:         func() (int, nvml.Return) { return len(devs), nvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(i int) (nvml.Device, nvml.Return) { return devs[i], nvml.SUCCESS },
	}
	n, err := openNVML(lib)
	if err != nil {
		t.Fatal(err)
	}
	got, err := n.GPUProcesses()
	if err == nil {
		t.Error("no error for the lost GPU 3")
	}
	want := map[int][]Process{
		// A stray context on GPU 0 sorts after the GPU the rank trains on.
		10: {{10, 1, "GPU-1", 70 << 30, "00000000:11:00.0"}, {10, 0, "GPU-0", 500 << 20, ""}},
		11: {{11, 0, "GPU-0", 500 << 20, ""}, {11, 2, "GPU-2", MemoryUnknown, "00000000:12:00.0"}},
		12: {{12, 0, "GPU-0", 70 << 30, ""}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got  %+v\nwant %+v", got, want)
	}
	if err := n.Close(); err != nil || !shut {
		t.Errorf("Close: %v, shut down %v", err, shut)
	}
}

func TestOpenNVMLInitFails(t *testing.T) {
	for _, ret := range []nvml.Return{nvml.ERROR_LIBRARY_NOT_FOUND, nvml.ERROR_DRIVER_NOT_LOADED, nvml.ERROR_NO_PERMISSION, nvml.ERROR_UNKNOWN} {
		_, err := openNVML(&mock.Interface{InitFunc: func() nvml.Return { return ret }})
		if !errors.Is(err, ErrNVMLUnavailable) {
			t.Errorf("Init %d: got %v", ret, err)
		}
	}
}
