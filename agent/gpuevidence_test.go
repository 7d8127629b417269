package agent

import (
	"slices"
	"testing"
)

func TestSummariseGPU(t *testing.T) {
	const s = int64(1e9)
	h := []GPUSample{
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
