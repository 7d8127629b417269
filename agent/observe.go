package agent

import (
	"strings"
	"time"
)

// Observe reports the agent's self-metrics under the keys that
// selfmetrics.Table declares: every counter of Counters (the status
// counters map), and the gauges of Status and of the runtime control as the
// main goroutine last refreshed them. v is in the key's own unit (the table
// scales it); attrs are name/value pairs. Safe from any goroutine; it never
// waits for the main goroutine.
func (a *Agent) Observe(obs func(key string, v float64, attrs ...string)) {
	observeStatus(obs, a.Status(), a.lastControl.Load())
}

// observeStatus is the pure part of Observe.
func observeStatus(obs func(key string, v float64, attrs ...string), st Status, cs *ControlState) {
	for k, v := range st.Counters {
		obs(k, float64(v))
	}
	b := func(v bool) float64 {
		if v {
			return 1
		}
		return 0
	}
	obs("uptime_seconds", st.Uptime.Seconds())
	obs("processes", float64(st.Processes))
	obs("libraries", float64(st.Attached))
	obs("windows", float64(st.Windows))
	obs("facts", float64(st.Facts))
	obs("verdicts", float64(st.Verdicts))
	obs("alerts", float64(len(st.Alerts)))
	obs("duty_share", st.DutyShare)
	obs("duty_cost_estimate", st.DutyCost)
	state := st.DeviceState
	if cs != nil && cs.Paused {
		state = "paused"
	}
	for _, s := range []string{"off", "no-lib", "duty", "escalated", "paused"} {
		obs("device_collection_"+s, b(s == state))
	}
	if o := st.Overhead; o != nil {
		obs("overhead_budget", o.Budget)
		obs("overhead_spent_device", o.Device)
		obs("overhead_spent_uprobes", o.Uprobes)
		obs("overhead_hidden_uprobes", o.UprobesHidden)
		obs("overhead_spent_nccl_plugin", o.NCCLPlugin)
		obs("overhead_spent_library", o.Library)
		obs("overhead_spent_total", o.Total)
		obs("duty_cost_low", o.Cost.Low)
		obs("duty_cost_high", o.Cost.High)
		obs("duty_cost_pairs", float64(o.Cost.Pairs))
		obs("duty_cost_measured", b(o.Cost.Measured))
	}
	if cs == nil {
		return
	}
	obs("paused", b(cs.Paused))
	obs("detector_window_seconds", time.Duration(cs.Detector.Window).Seconds())
	obs("detector_threshold", cs.Detector.Threshold)
	for ph, v := range cs.Detector.PhaseThresholds {
		if ph != "" && !strings.ContainsAny(ph, " \n") {
			obs("detector_phase_threshold_"+ph, v)
		}
	}
	obs("detector_floor_seconds", time.Duration(cs.Detector.Floor).Seconds())
	obs("detector_consecutive", float64(cs.Detector.Consecutive))
	if cs.Duty != nil {
		obs("duty_budget", cs.Duty.Budget)
	}
}
