package duty

import (
	"fmt"
	"math"
	"time"
)

// The NCCL profiler plugin's kernel-channel events (the GPU start and end
// of each collective: the device arrival order) are on only in the duty
// cycle's on-phases, so their cost falls into the on-blocks the cost
// estimate pairs with the off steps around them. That bounds it (the share
// shrinks as the on-blocks cost more) but does not say whose cost it is:
// an NCCL release whose profiler path regressed under kernel-channel events
// (NCCL 2.31.2 against 2.29.7, NVIDIA/nccl#2355: +4 to +13 % on small
// all-reduces with KernelCh in the mask, around 1 % without) would make
// every on-block dear, CUPTI's records with it. So the agent measures them
// apart instead of trusting a list of versions: while a process is on the
// plugin path it alternates, every two periods, on-blocks with and without
// them (cupti.Duty.NCCLNoKernelChannels), and compares the two arms' paired
// ratios. Their difference is the kernel channels' cost per on-block:
// clearly above KernelChannelLimit, they stay off for good (device arrival
// evidence is lost, CUPTI's records are kept); clearly below it, or not
// told apart from it after KernelChannelMaxPairs blocks an arm, on.

// KernelChannelMode is --nccl-kernel-channels.
type KernelChannelMode uint8

// Kernel-channel modes: measure (auto), or as the operator says.
const (
	KernelChannelsAuto KernelChannelMode = iota
	KernelChannelsOn
	KernelChannelsOff
)

// ParseKernelChannelMode reads --nccl-kernel-channels.
func ParseKernelChannelMode(s string) (KernelChannelMode, error) {
	switch s {
	case "auto":
		return KernelChannelsAuto, nil
	case "on":
		return KernelChannelsOn, nil
	case "off":
		return KernelChannelsOff, nil
	}
	return 0, fmt.Errorf("want auto, on or off, got %q", s)
}

// Kernel-channel states (KernelChannels.State).
const (
	KernelChannelsIdle   = ""      // no plugin operation yet: nothing to measure
	KernelChannelsTrial  = "trial" // alternating on-blocks with and without them
	KernelChannelsKept   = "on"
	KernelChannelsDenied = "off"
)

// KernelChannels is the trial's state and measurement, as status shows it.
// Cost is the kernel channels' share of an on-block's step time (the
// with-arm's mean ratio minus the without-arm's), Low and High its 95 %
// interval.
type KernelChannels struct {
	State  string  `json:"state"`
	Reason string  `json:"reason,omitempty"`
	Cost   float64 `json:"cost"`
	Low    float64 `json:"low"`
	High   float64 `json:"high"`
	With   int     `json:"blocks_with"`
	Apart  int     `json:"blocks_without"`
	// Limit is the limit the measurement was held against (0: the
	// operator decided).
	Limit float64 `json:"limit,omitempty"`
}

// armSlack is how long before an on-block an arm must have been asked for
// the block to count as that arm's: the plan is written within a tick, the
// library applies it within a poll.
const armSlack = int64(500 * time.Millisecond)

const maxArmSwitches = 64

// kchTrial is the trial's state in Ledger.
type kchTrial struct {
	seen     bool // a plugin operation was observed
	on       bool // the arm asked for: kernel channels on
	switches []armSwitch
	since    int64
	result   KernelChannels
}

type armSwitch struct {
	at int64
	on bool
}

// arm returns whether kernel channels are asked for at now, alternating
// every two periods during the trial.
func (d *Ledger) kernelChannelsAt(now int64, period time.Duration) bool {
	t := &d.kch
	switch {
	case d.cfg.KernelChannels == KernelChannelsOff:
		t.result.State, t.result.Reason = KernelChannelsDenied, "--nccl-kernel-channels off"
		return false
	case d.cfg.KernelChannels == KernelChannelsOn:
		t.result.State, t.result.Reason = KernelChannelsKept, "--nccl-kernel-channels on"
		return true
	case !t.seen:
		return true // no plugin: the flag changes nothing
	}
	switch t.result.State {
	case KernelChannelsKept:
		return true
	case KernelChannelsDenied:
		return false
	}
	if t.result.State == KernelChannelsIdle {
		t.result.State, t.on = KernelChannelsTrial, true
		t.switchArm(now, true)
	}
	if now-t.since >= 2*int64(period) {
		t.switchArm(now, !t.on)
	}
	d.decideKernelChannels()
	return t.result.State != KernelChannelsDenied && (t.result.State == KernelChannelsKept || t.on)
}

func (t *kchTrial) switchArm(now int64, on bool) {
	t.on, t.since = on, now
	t.switches = append(t.switches, armSwitch{now, on})
	if len(t.switches) > maxArmSwitches {
		t.switches = append(t.switches[:0], t.switches[1:]...)
	}
}

// armOf returns the arm of an on-block [from, to]: 1 with kernel channels,
// 0 without, -1 when no single arm was in force over it (a switch inside,
// or no trial).
func (t *kchTrial) armOf(from, to int64) int8 {
	if t.result.State != KernelChannelsTrial || len(t.switches) == 0 {
		return -1
	}
	arm := int8(-1)
	for _, s := range t.switches {
		switch {
		case s.at <= from-armSlack:
			arm = 0
			if s.on {
				arm = 1
			}
		case s.at <= to:
			return -1
		}
	}
	return arm
}

// decideKernelChannels ends the trial once the arms' difference is clearly
// above or below the limit, or after KernelChannelMaxPairs blocks an arm.
func (d *Ledger) decideKernelChannels() {
	var with, without []float64
	for _, cl := range d.clusters {
		switch cl.arm {
		case 1:
			with = append(with, cl.sum/float64(cl.n))
		case 0:
			without = append(without, cl.sum/float64(cl.n))
		}
	}
	r := &d.kch.result
	r.With, r.Apart = len(with), len(without)
	need := max(d.cfg.KernelChannelPairs, 2)
	if len(with) < need || len(without) < need {
		return
	}
	mw, hw := trimmedMeanCI(with, trimFraction)
	mo, ho := trimmedMeanCI(without, trimFraction)
	half := math.Hypot(hw, ho)
	limit := d.cfg.KernelChannelLimit
	r.Cost, r.Low, r.High, r.Limit = mw-mo, mw-mo-half, mw-mo+half, limit
	switch {
	case r.Low > limit:
		r.State = KernelChannelsDenied
		r.Reason = fmt.Sprintf("they cost %+.2f %% [%+.2f, %+.2f] of step time in an on-phase, above the %.2f %% limit: NCCL's profiler path under kernel-channel events is dear in this release",
			100*r.Cost, 100*r.Low, 100*r.High, 100*limit)
		d.estValid = false // the with-arm's blocks no longer describe collection
	case r.High < limit:
		r.State, r.Reason = KernelChannelsKept, fmt.Sprintf("they cost %+.2f %% [%+.2f, %+.2f] of step time in an on-phase, below the %.2f %% limit", 100*r.Cost, 100*r.Low, 100*r.High, 100*limit)
	case min(len(with), len(without)) >= d.cfg.KernelChannelMaxPairs:
		r.State, r.Reason = KernelChannelsKept, fmt.Sprintf("not told apart from the %.2f %% limit after %d blocks an arm (%+.2f %% [%+.2f, %+.2f]): kept, their cost is in the measured collection cost",
			100*limit, min(len(with), len(without)), 100*r.Cost, 100*r.Low, 100*r.High)
	}
}

// KernelChannelsResult is the trial's state and measurement.
func (d *Ledger) KernelChannelsResult() KernelChannels { return d.kch.result }
