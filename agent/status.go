package agent

import (
	"strings"
	"time"

	"github.com/slowrank/slowrank/agent/duty"
	"github.com/slowrank/slowrank/agent/pipeline"
	"github.com/slowrank/slowrank/cupti"
	"github.com/slowrank/slowrank/detector"
)

// RankView is one row of the live view: a rank's latest step and verdict.
type RankView = pipeline.RankView

// Overhead is the duty ledger's account that Status carries (duty.Overhead
// says what each figure is).
type Overhead = duty.Overhead

// Status is a snapshot of what a running agent is doing: the live view and
// `slowrank status` show it.
type Status struct {
	Uptime      time.Duration `json:"uptime_ns"`
	Processes   int           `json:"processes"`
	Attached    int           `json:"libraries_attached"`
	Events      int64         `json:"events"`
	Lost        int64         `json:"lost"`
	Windows     int64         `json:"windows"`
	Facts       int64         `json:"facts"`
	Verdicts    int64         `json:"verdicts"`
	Uprobes     string        `json:"uprobes"` // "uprobe_multi" or "perf_event" links
	DeviceState string        `json:"device_collection"`
	DutyShare   float64       `json:"duty_share"`
	DutyCost    float64       `json:"duty_cost_estimate"`
	// DutyPeriodNS is the planned period: the configured one, doubled while
	// the share would leave on-blocks shorter than a few steps.
	DutyPeriodNS int64              `json:"duty_period_ns"`
	Ranks        []RankView         `json:"ranks"`
	Alerts       []detector.Verdict `json:"alerts"`
	Recent       []detector.Verdict `json:"recent_verdicts"`
	Procs        []ProcessView      `json:"process_list"`
	Counters     map[string]int64   `json:"counters"`
	Overhead     *Overhead          `json:"overhead,omitempty"` // cost estimate and budget ledger (agent/duty)
}

// StatusReport is the body of GET /status: the agent's Status, its
// runtime-control state and its outputs' health.
type StatusReport struct {
	Status
	Version string `json:"version,omitempty"`
	// Control is absent when the agent did not answer in time (stopping);
	// ControlError then says why.
	Control      *ControlState `json:"control,omitempty"`
	ControlError string        `json:"control_error,omitempty"`
	Export       *ExportHealth `json:"export,omitempty"`
}

// ExportHealth describes the agent's outputs; the command that wires them
// fills it in (the agent does not know the exporters).
type ExportHealth struct {
	// OTel is "off", "otlp" or "stdout"; Endpoint the OTLP endpoint.
	OTel     string `json:"otel"`
	Endpoint string `json:"endpoint,omitempty"`
	// Counters are the exporter's own counters (spans exported, dropped,
	// export errors, ...).
	Counters map[string]int64 `json:"counters,omitempty"`
	// Files are the JSONL outputs (facts, verdicts) by name.
	Files map[string]string `json:"files,omitempty"`
}

// Status returns a snapshot; safe to call from any goroutine while Run runs.
func (a *Agent) Status() Status {
	snap := a.pipe.Snapshot()
	c := a.counters.snapshot()
	st := Status{
		Uptime:      time.Since(a.started),
		Procs:       a.att.processes(),
		Attached:    int(c["libraries_attached"] - c["libraries_detached"]),
		Events:      c["events"],
		Lost:        c["ringbuf_lost"] + c["events_lost_queue"] + c["events_malformed"],
		Windows:     snap.Windows,
		Facts:       snap.Facts,
		Ranks:       snap.Ranks,
		Recent:      snap.Recent,
		Counters:    c,
		DeviceState: "off",
		Uprobes:     "perf_event",
	}
	if a.probes.UprobeMulti() {
		st.Uprobes = "uprobe_multi"
	}
	st.Processes = len(st.Procs)
	withNCCLPaths(st.Procs, a.conv.NCCLPaths())
	for _, r := range snap.Ranks {
		if r.Verdict != nil && r.Verdict.AlertActive {
			st.Alerts = append(st.Alerts, *r.Verdict)
		}
	}
	st.Verdicts = snap.Verdicts
	injected, pluginOnly := 0, 0
	for _, p := range st.Procs {
		switch {
		case p.CUPTI == PluginOnly:
			pluginOnly++ // mapped, but no device collection to steer
		case p.Injected:
			injected++
		}
	}
	if d := a.dutyPlan(); d != nil {
		o := d.Overhead // uprobes cost even without the injection library
		st.Overhead = &o
	}
	if injected == 0 && pluginOnly > 0 {
		st.DeviceState = "off: libslowrank_cupti.so runs as NCCL's profiler plugin only (CUDA did not load it)"
	} else if injected == 0 {
		st.DeviceState = "no-lib"
	} else if d := a.dutyPlan(); d != nil {
		st.DutyShare, st.DutyCost, st.DutyPeriodNS = d.OnShare, d.Cost, int64(d.Period)
		st.DeviceState = "duty"
		if d.Escalate {
			st.DeviceState = "escalated"
		}
	}
	return st
}

// PluginOnly is ProcessView.CUPTI of a process whose NCCL loaded the
// injection library as its profiler plugin while the CUDA driver never
// initialised it: its control block stays in state "init" (no CUPTI, no
// device records), which would read as starting up.
const PluginOnly = "off: loaded by NCCL as its profiler plugin only"

// withNCCLPaths fills each process's NCCL capture path; a process the
// converter has not seen an event of yet is on uprobes (the default path).
func withNCCLPaths(procs []ProcessView, paths map[uint32]string) {
	for i := range procs {
		procs[i].NCCL = "uprobes"
		if p, ok := paths[uint32(procs[i].PID)]; ok {
			procs[i].NCCL = p
		}
		if procs[i].CUPTI == cupti.StateInit.String() && strings.HasPrefix(procs[i].NCCL, "plugin") {
			procs[i].CUPTI = PluginOnly
		}
	}
}
