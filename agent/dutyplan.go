package agent

import (
	"github.com/slowrank/slowrank/agent/capture"
	"github.com/slowrank/slowrank/agent/duty"
	"github.com/slowrank/slowrank/bpf"
)

// trapsPerEvent is how many uprobe traps one event of a probe stands for
// (two for an entry/return pair joined in BPF, one for an entry probe), and
// criticalPerEvent how many of them delay the step whatever the host's lead
// (Traps): both of a call that waits for the device or for a peer. Its
// return fires when the device is done; its entry may come while the
// device waits for the host (a data pipeline's synchronisation before the
// step's work is queued). They are few a step; the many are collectives.
var trapsPerEvent, criticalPerEvent = func() (t, c [bpf.MaxProbeID]uint64) {
	for _, s := range bpf.Specs() {
		if int(s.ID) >= len(t) {
			continue
		}
		t[s.ID] = 1
		if s.Return == "" {
			continue
		}
		t[s.ID] = 2
		switch s.Class {
		case bpf.ClassSyncWait, bpf.ClassTorchWorkWait, bpf.ClassTorchFutureWait:
			c[s.ID] = 2
		}
	}
	return t, c
}()

// planDuty feeds the uprobe traps and the NCCL profiler plugin's
// operations since the last call to the ledger, plans the duty cycle and
// applies it. Main goroutine.
//
// A process on the NCCL plugin path traps on the libnccl collective
// uprobes until every process mapping that file is on the plugin path and
// they are detached (agent/attach/collectives.go); until then the converter
// drops the events it reads (nccl_uprobe_events_superseded), and they are
// counted here like any other, because their traps were paid. The
// plugin's operations cost the process too, with the uprobes attached or
// not: every plugin collective or send/recv record the converter took,
// whatever became of it (capture.PluginOps), is charged at
// NCCLPluginCost.
func (a *Agent) planDuty(now int64) {
	var traps, critical uint64
	for id := range a.probeCounts {
		n := a.probeCounts[id].Load()
		traps += (n - a.trapsSeen[id]) * trapsPerEvent[id]
		critical += (n - a.trapsSeen[id]) * criticalPerEvent[id]
		a.trapsSeen[id] = n
	}
	ops := capture.PluginOps(a.counters.get)
	ops, a.pluginOpsSeen = ops-a.pluginOpsSeen, ops
	collecting := false
	for _, pe := range a.att.procs {
		collecting = collecting || pe.canCollect()
	}
	a.duty.SetCollecting(now, collecting && !a.att.paused)
	if procs := float64(len(a.att.procs)); procs > 0 {
		// Ranks issue the same collective sequence: the mean per process
		// is each one's share.
		a.duty.ObserveTraps(now, duty.Traps{Total: float64(traps) / procs, Critical: float64(critical) / procs})
		a.duty.ObservePluginOps(now, float64(ops)/procs)
	}
	plan := a.duty.Plan(now)
	a.att.applyDuty(plan)
	a.planMu.Lock()
	a.plan = &plan
	a.planMu.Unlock()
	o := plan.Overhead
	a.counters.set("duty_escalations_granted", o.EscalationsGranted)
	a.counters.set("duty_escalations_refused", o.EscalationsRefused)
	a.counters.set("duty_pairs_dropped_short", o.PairsDropped.Short)
	a.counters.set("duty_pairs_dropped_drift", o.PairsDropped.Drift)
	a.counters.set("duty_pairs_dropped_suspect", o.PairsDropped.Suspect)
	a.noteKernelChannels(o.KernelChannels)
}

// noteKernelChannels logs the kernel-channel trial's decision once and
// keeps its gauge (0: on or undecided, 1: off).
func (a *Agent) noteKernelChannels(k *duty.KernelChannels) {
	if k == nil {
		return
	}
	off := int64(0)
	if k.State == duty.KernelChannelsDenied {
		off = 1
	}
	a.counters.set("nccl_kernel_channels_off", off)
	if k.State == a.kchLogged {
		return
	}
	a.kchLogged = k.State
	switch k.State {
	case duty.KernelChannelsDenied:
		a.log.Warn("NCCL plugin kernel-channel events off: no device arrival order from now on", "reason", k.Reason)
	case duty.KernelChannelsKept, duty.KernelChannelsTrial:
		a.log.Info("NCCL plugin kernel-channel events "+k.State, "reason", k.Reason)
	}
}
