package duty

import (
	"strings"
	"testing"
	"time"
)

// The NCCL plugin's kernel-channel events are measured apart: on-blocks
// with and without them alternate while a process is on the plugin path,
// and they stay only while their cost per on-phase is below the limit. A
// release whose profiler path is dear under them (NCCL 2.31.2,
// NVIDIA/nccl#2355) is found by that measurement.
func TestKernelChannelsMeasuredApart(t *testing.T) {
	for _, tc := range []struct {
		name      string
		mode      KernelChannelMode
		pluginOps float64
		kchCost   float64
		want      string // the state after the run
		wantOn    bool   // the last plan's KernelChannels
	}{
		{"kernel channels that cost 5 % of an on-phase are turned off", KernelChannelsAuto, 1000, 0.05, KernelChannelsDenied, false},
		{"kernel channels that cost nothing are kept", KernelChannelsAuto, 1000, 0, KernelChannelsKept, true},
		{"without plugin operations nothing is tried", KernelChannelsAuto, 0, 0.05, KernelChannelsIdle, true},
		{"the operator's off holds", KernelChannelsOff, 1000, 0, KernelChannelsDenied, false},
		{"the operator's on holds, however dear", KernelChannelsOn, 1000, 0.05, KernelChannelsKept, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.KernelChannels = tc.mode
			s := newDutySim(cfg, 3)
			s.cost, s.pluginOps, s.kchCost = 0.02, tc.pluginOps, tc.kchCost
			s.run(20 * time.Minute)
			k := s.d.KernelChannelsResult()
			if k.State != tc.want || s.plan.KernelChannels != tc.wantOn {
				t.Fatalf("state %q (%s), plan on %v; want %q and %v (blocks %d with, %d without)",
					k.State, k.Reason, s.plan.KernelChannels, tc.want, tc.wantOn, k.With, k.Apart)
			}
			if tc.mode != KernelChannelsAuto || tc.pluginOps == 0 {
				return
			}
			if !(k.Low <= tc.kchCost && tc.kchCost <= k.High) {
				t.Errorf("measured %+.4f [%+.4f, %+.4f], true %g", k.Cost, k.Low, k.High, tc.kchCost)
			}
			if tc.want == KernelChannelsDenied {
				if !strings.Contains(k.Reason, "above the 1.00 % limit") {
					t.Errorf("reason %q", k.Reason)
				}
				// The blocks with them left the cost estimate: what is
				// charged is collection as it is now.
				s.run(5 * time.Minute)
				if e := s.d.Estimate(); !(e.Low <= s.cost && s.cost <= e.High) {
					t.Errorf("cost estimate %+v after the trial, collection now costs %g", e, s.cost)
				}
			}
		})
	}
}

// An on-block counts for the arm asked for before it began (by armSlack)
// and until its end; one with a switch inside counts for neither.
func TestKernelChannelArmOfABlock(t *testing.T) {
	s := int64(time.Second)
	tr := kchTrial{result: KernelChannels{State: KernelChannelsTrial},
		switches: []armSwitch{{at: 10 * s, on: true}, {at: 30 * s, on: false}, {at: 50 * s, on: true}}}
	for _, tc := range []struct {
		from, to int64
		want     int8
	}{
		{12 * s, 13 * s, 1},
		{32 * s, 33 * s, 0},
		{30*s + armSlack/2, 31 * s, -1}, // asked for too late
		{29 * s, 31 * s, -1},            // a switch inside
		{5 * s, 6 * s, -1},              // before the trial
		{60 * s, 61 * s, 1},
	} {
		if got := tr.armOf(tc.from, tc.to); got != tc.want {
			t.Errorf("block [%d s, %d s]: arm %d, want %d", tc.from/s, tc.to/s, got, tc.want)
		}
	}
}
