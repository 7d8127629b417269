package gpu

import (
	"slices"
	"testing"

	"github.com/slowrank/slowrank/detector"
)

func TestSummariseGPU(t *testing.T) {
	const s = int64(1e9)
	h := []Sample{
		{AtNS: 1 * s, Index: 3, UUID: "GPU-x", SMClockMHz: 1980, PowerMW: 500000, TempC: 50, ECCUncorrected: 2, PCIeReplays: 10},
		{AtNS: 6 * s, Index: 3, UUID: "GPU-x", SMClockMHz: 1980, SMClockLimitMHz: 1980, PowerMW: 690000, TempC: 71, PCIeReplays: 10, ECCUncorrected: 2},
		{AtNS: 7 * s, Index: 3, UUID: "GPU-x", SMClockMHz: 1410, SMClockLimitMHz: 1980, PowerMW: 700000, TempC: 88, ThrottleReasons: 0x4 | 0x40, ECCUncorrected: 3, PCIeReplays: 14},
		{AtNS: 11 * s, Index: 3, UUID: "GPU-x", SMClockMHz: 900, TempC: 99},
	}
	ev := summariseGPU(h, 5*s, 10*s)
	if ev == nil {
		t.Fatal("no evidence")
	}
	if ev.Samples != 2 || ev.SMClockMinMHz != 1410 || ev.SMClockMaxMHz != 1980 || ev.TempMaxC != 88 || ev.PowerMaxW != 700 {
		t.Errorf("extremes wrong: %+v", ev)
	}
	if !slices.Equal(ev.ThrottleReasons, []string{"sw_power_cap", "hw_thermal_slowdown"}) {
		t.Errorf("reasons = %v", ev.ThrottleReasons)
	}
	if ev.ECCUncorrected != 1 || ev.PCIeReplays != 4 {
		t.Errorf("deltas = %d ECC, %d PCIe; want 1 and 4 against the sample before the window", ev.ECCUncorrected, ev.PCIeReplays)
	}
	if summariseGPU(h, 20*s, 25*s) != nil {
		t.Error("evidence for a window without samples")
	}
}

func TestRankGPU(t *testing.T) {
	g := func(idx int, mem uint64) Process {
		return Process{PID: 1, GPUIndex: idx, UUID: "GPU-" + string(rune('a'+idx)), UsedMemory: mem, PCIBusID: "00000000:1" + string(rune('0'+idx)) + ":00.0"}
	}
	tests := []struct {
		name string
		gs   []Process
		want detector.RankGPU
		ok   bool
	}{
		{"no context", nil, detector.RankGPU{}, false},
		{"one GPU", []Process{g(3, 70<<30)}, detector.RankGPU{Index: 3, UUID: "GPU-d", PCIBusID: "00000000:13:00.0"}, true},
		{"one GPU, memory unknown", []Process{g(2, MemoryUnknown)}, detector.RankGPU{Index: 2, UUID: "GPU-c", PCIBusID: "00000000:12:00.0"}, true},
		{"stray context on GPU 0", []Process{g(5, 70<<30), g(0, 500<<20)}, detector.RankGPU{Index: 5, UUID: "GPU-f", PCIBusID: "00000000:15:00.0"}, true},
		{"two alike", []Process{g(1, 1<<30), g(2, 1<<30)}, detector.RankGPU{}, false},
		{"memory unknown on one of two", []Process{g(1, 1<<30), g(2, MemoryUnknown)}, detector.RankGPU{}, false},
		{"no UUID", []Process{{GPUIndex: 1}}, detector.RankGPU{}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := rankGPU(tc.gs)
			if got != tc.want || ok != tc.ok {
				t.Errorf("got %+v %v, want %+v %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}
