package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/slowrank/slowrank/agent/duty"
	"github.com/slowrank/slowrank/agent/pipeline"
	"github.com/slowrank/slowrank/cupti"
	"github.com/slowrank/slowrank/detector"
)

// Runtime control of a running agent, without a restart: pause and resume
// collection, change the detector's window, threshold, floor and
// consecutive count, change the duty cycle of device collection. Each change
// runs on the agent's main goroutine (a.do), where the attacher, the
// pipeline and the duty controller live; the state below is touched by
// nothing else.

// Errors of Control. ErrInvalidControl wraps every rejected request.
var (
	ErrInvalidControl = errors.New("invalid control request")
	// ErrSwapInProgress: the previous detector change has not settled its
	// last window yet (at most one window plus the lateness allowance).
	ErrSwapInProgress = pipeline.ErrSwapInProgress
	// ErrNoDeviceCollection: duty-cycle changes need device collection
	// (Config.DeviceCollection).
	ErrNoDeviceCollection = errors.New("device collection is off: the duty cycle is not steered by this agent")
)

// Control actions.
const (
	ActionPause  = "pause"
	ActionResume = "resume"
	ActionSet    = "set"
)

// Duration is a time.Duration written in JSON as a Go duration string
// ("5s", "250ms").
type Duration time.Duration

// MarshalText writes the duration as "5s".
func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

// UnmarshalText reads a Go duration string.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return fmt.Errorf("duration %q: want a Go duration such as \"5s\"", b)
	}
	*d = Duration(v)
	return nil
}

// UnmarshalJSON accepts only strings, so that a bare number is not
// silently taken as nanoseconds.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration %s: want a string such as \"5s\"", b)
	}
	return d.UnmarshalText([]byte(s))
}

// ControlRequest is the body of POST /control. Fields other than Action
// apply to "set" only; absent fields are left as they are.
type ControlRequest struct {
	Action string `json:"action"`
	// Detector settings (DESIGN.md section 4). A change starts a new
	// detector at the next window boundary: see SetDetector.
	Window      *Duration `json:"window,omitempty"`
	Threshold   *float64  `json:"threshold,omitempty"`
	Floor       *Duration `json:"floor,omitempty"`
	Consecutive *int      `json:"consecutive,omitempty"`
	// PhaseThresholds set per-phase overrides of Threshold; a value of 0
	// removes a phase's override. Phases not named keep theirs.
	PhaseThresholds map[string]float64 `json:"phase_thresholds,omitempty"`
	// Duty cycle of device collection. DutyShare pins the on-share of each
	// period (0 < share <= 1), DutyAuto returns it to the budget, DutyBudget
	// changes the overhead budget (0 < budget < 1), DutyPeriod the period.
	DutyBudget *float64  `json:"duty_budget,omitempty"`
	DutyShare  *float64  `json:"duty_share,omitempty"`
	DutyAuto   bool      `json:"duty_auto,omitempty"`
	DutyPeriod *Duration `json:"duty_period,omitempty"`
}

func (r ControlRequest) hasDetector() bool {
	return r.Window != nil || r.Threshold != nil || r.Floor != nil || r.Consecutive != nil || len(r.PhaseThresholds) > 0
}

func (r ControlRequest) hasDuty() bool {
	return r.DutyBudget != nil || r.DutyShare != nil || r.DutyAuto || r.DutyPeriod != nil
}

// Validate checks the request without an agent: known action, settings
// only with "set", values in range.
func (r ControlRequest) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidControl, fmt.Sprintf(format, args...))
	}
	switch r.Action {
	case ActionPause, ActionResume:
		if r.hasDetector() || r.hasDuty() {
			return bad("%q takes no settings; use \"set\"", r.Action)
		}
		return nil
	case ActionSet:
	case "":
		return bad("action is missing (pause, resume or set)")
	default:
		return bad("unknown action %q (pause, resume or set)", r.Action)
	}
	if !r.hasDetector() && !r.hasDuty() {
		return bad("\"set\" needs at least one of window, threshold, phase_thresholds, floor, consecutive, duty_budget, duty_share, duty_auto, duty_period")
	}
	if r.Window != nil && time.Duration(*r.Window) < duty.MinWindow {
		return bad("window must be at least %s, got %s", duty.MinWindow, time.Duration(*r.Window))
	}
	if r.Threshold != nil && !(*r.Threshold > 0 && *r.Threshold < 1) {
		return bad("threshold must be a fraction in (0, 1), got %g", *r.Threshold)
	}
	for _, ph := range slices.Sorted(maps.Keys(r.PhaseThresholds)) {
		if t := r.PhaseThresholds[ph]; ph == "" || !(t >= 0 && t < 1) {
			return bad("phase threshold %q=%g: want a phase name and a fraction in (0, 1), or 0 to remove the override", ph, t)
		}
	}
	if r.Floor != nil && *r.Floor < 0 {
		return bad("floor must not be negative, got %s", time.Duration(*r.Floor))
	}
	if r.Consecutive != nil && *r.Consecutive < 1 {
		return bad("consecutive must be at least 1, got %d", *r.Consecutive)
	}
	if r.DutyBudget != nil && !(*r.DutyBudget > 0 && *r.DutyBudget < 1) {
		return bad("duty_budget must be in (0, 1), got %g", *r.DutyBudget)
	}
	if r.DutyShare != nil && !(*r.DutyShare > 0 && *r.DutyShare <= 1) {
		return bad("duty_share must be in (0, 1], got %g", *r.DutyShare)
	}
	if r.DutyShare != nil && r.DutyAuto {
		return bad("duty_share and duty_auto exclude each other")
	}
	if r.DutyPeriod != nil && time.Duration(*r.DutyPeriod) < duty.MinPeriod {
		return bad("duty_period must be at least %s, got %s", duty.MinPeriod, time.Duration(*r.DutyPeriod))
	}
	return nil
}

// ControlState is what runtime control has made of the agent.
type ControlState struct {
	Paused bool `json:"paused"`
	// PausedFor is how long collection has been paused.
	PausedFor Duration         `json:"paused_for,omitempty"`
	Detector  DetectorSettings `json:"detector"`
	// DetectorSwaps counts detector changes; SwapSettling is true while the
	// previous detector still settles its last window.
	DetectorSwaps int64 `json:"detector_swaps"`
	SwapSettling  bool  `json:"detector_swap_settling"`
	// Duty is nil without device collection.
	Duty *DutySettings `json:"duty,omitempty"`
	// Records and Facts count what the correlator and the detector saw
	// late or twice (summed over ranks and jobs).
	Records RecordCounts `json:"records"`
	Facts   FactCounts   `json:"facts"`
}

// DetectorSettings are the detector settings that can change at run time.
type DetectorSettings struct {
	Window    Duration `json:"window"`
	Threshold float64  `json:"threshold"`
	// PhaseThresholds are the per-phase overrides of Threshold (set at start).
	PhaseThresholds map[string]float64 `json:"phase_thresholds,omitempty"`
	Floor           Duration           `json:"floor"`
	Consecutive     int                `json:"consecutive"`
	Lateness        Duration           `json:"lateness"`
}

// DutySettings are the duty-cycle settings.
type DutySettings struct {
	Budget float64  `json:"budget"`
	Period Duration `json:"period"`
	// PinnedShare is the on-share set with duty_share (0: steered by the
	// budget).
	PinnedShare float64 `json:"pinned_share,omitempty"`
	MinShare    float64 `json:"min_share"`
	MaxShare    float64 `json:"max_share"`
}

// RecordCounts are the correlator's loss counters.
type RecordCounts struct {
	Late          uint64 `json:"late"`
	Duplicate     uint64 `json:"duplicate"`
	DroppedHost   uint64 `json:"dropped_host"`
	DroppedDevice uint64 `json:"dropped_device"`
}

// FactCounts are the detector's counters over all jobs.
type FactCounts struct {
	Late       int64 `json:"late"`
	Duplicates int64 `json:"duplicates"`
	Evicted    int64 `json:"evicted"`
	// LateAfterSwap counts steps that ended before a detector change's
	// boundary but arrived after the old detector had settled.
	LateAfterSwap int64 `json:"late_after_swap"`
}

// controlState is the agent's runtime-control state (main goroutine only).
type controlState struct {
	// pausedAt is when collection was paused (attacher.paused).
	pausedAt time.Time
	// pinned is the on-share pinned by duty_share (0: none); minShare and
	// maxShare are the bounds it replaced.
	pinned             float64
	minShare, maxShare float64
}

// Control validates req and applies it on the agent's main goroutine. It
// returns the resulting state. Errors: ErrInvalidControl (bad request),
// ErrSwapInProgress, ErrNoDeviceCollection, or ctx's error when the agent
// does not answer (not running, stopping).
func (a *Agent) Control(ctx context.Context, req ControlRequest) (ControlState, error) {
	if err := req.Validate(); err != nil {
		return ControlState{}, err
	}
	var (
		st  ControlState
		err error
	)
	if derr := a.do(ctx, func() {
		switch req.Action {
		case ActionPause:
			a.pause()
		case ActionResume:
			a.resume()
		case ActionSet:
			err = a.set(req)
		}
		st = a.controlState()
	}); derr != nil {
		return ControlState{}, fmt.Errorf("agent not answering: %w", derr)
	}
	return st, err
}

// Pause stops collection without detaching: every training process is
// removed from the BPF filter (its events are no longer recorded) and the
// injection libraries' duty cycle is set to off. Processes found while
// paused are not tracked until Resume.
func (a *Agent) Pause(ctx context.Context) error {
	_, err := a.Control(ctx, ControlRequest{Action: ActionPause})
	return err
}

// Resume undoes Pause: processes are tracked again and the duty cycle is
// re-applied.
func (a *Agent) Resume(ctx context.Context) error {
	_, err := a.Control(ctx, ControlRequest{Action: ActionResume})
	return err
}

// ControlState returns the runtime-control state and the loss counters.
func (a *Agent) ControlState(ctx context.Context) (ControlState, error) {
	var st ControlState
	if err := a.do(ctx, func() { st = a.controlState() }); err != nil {
		return ControlState{}, fmt.Errorf("agent not answering: %w", err)
	}
	return st, nil
}

func (a *Agent) pause() {
	if a.att.paused {
		return
	}
	a.att.paused, a.control.pausedAt = true, time.Now()
	off := cupti.Duty{Mode: cupti.DutyOff}
	for _, pe := range a.att.procs {
		if err := a.probes.Untrack(uint32(pe.proc.PID)); err != nil {
			a.counters.add("untrack_errors", 1)
			a.log.Warn("pause: untrack process", "pid", pe.proc.PID, "err", err)
		}
		if pe.inject == nil {
			continue
		}
		if err := a.att.writeDuty(pe, off); err != nil {
			a.counters.add("duty_write_errors", 1)
			a.log.Debug("pause: write duty cycle", "pid", pe.proc.PID, "err", err)
			continue
		}
		pe.lastDuty, pe.dutyValid = off, true
	}
	a.counters.add("control_pauses", 1)
	a.log.Info("collection paused", "processes", len(a.att.procs))
}

func (a *Agent) resume() {
	if !a.att.paused {
		return
	}
	pausedFor := time.Since(a.control.pausedAt)
	a.att.paused = false
	for _, pe := range a.att.procs {
		if err := a.probes.Track(uint32(pe.proc.PID), uint32(pe.rank)); err != nil {
			a.counters.add("track_errors", 1)
			a.log.Warn("resume: track process", "pid", pe.proc.PID, "err", err)
		}
		pe.dutyValid = false // re-apply whatever the plan says
	}
	if a.duty != nil {
		a.applyPlan()
	} else {
		// Without duty steering the library's own default applies.
		for _, pe := range a.att.procs {
			if pe.inject == nil {
				continue
			}
			if err := a.att.writeDuty(pe, cupti.DefaultDuty); err != nil {
				a.counters.add("duty_write_errors", 1)
				continue
			}
			pe.lastDuty, pe.dutyValid = cupti.DefaultDuty, true
		}
	}
	a.counters.add("control_resumes", 1)
	a.log.Info("collection resumed", "processes", len(a.att.procs), "paused_for", pausedFor.Round(time.Second))
}

// applyPlan plans the duty cycle now and applies it (as Run does every
// second), unless collection is paused.
func (a *Agent) applyPlan() {
	if a.duty == nil || a.att.paused {
		return
	}
	a.planDuty(monotonicNow())
}

// withDetectorSettings returns cfg changed by the detector fields of req.
func withDetectorSettings(cfg detector.Config, req ControlRequest) detector.Config {
	if req.Window != nil {
		cfg.Window = time.Duration(*req.Window)
	}
	if req.Threshold != nil {
		cfg.Threshold = *req.Threshold
	}
	if len(req.PhaseThresholds) > 0 {
		over := maps.Clone(cfg.PhaseThresholds)
		if over == nil {
			over = map[string]float64{}
		}
		for ph, t := range req.PhaseThresholds {
			if t == 0 {
				delete(over, ph)
			} else {
				over[ph] = t
			}
		}
		cfg.PhaseThresholds = over
	}
	if req.Floor != nil {
		cfg.Floor = time.Duration(*req.Floor)
	}
	if req.Consecutive != nil {
		cfg.Consecutive = *req.Consecutive
	}
	return cfg
}

// set applies the settings of a "set" request: all or nothing.
func (a *Agent) set(req ControlRequest) error {
	if req.hasDuty() && a.duty == nil {
		return ErrNoDeviceCollection
	}
	var newDet *detector.Config
	if req.hasDetector() {
		if a.pipe.SwapStatus().Settling {
			return ErrSwapInProgress
		}
		cfg := withDetectorSettings(a.pipe.DetectorConfig(), req)
		if err := cfg.Validate(); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidControl, err)
		}
		newDet = &cfg
	}
	if newDet != nil {
		old := a.pipe.DetectorConfig()
		if err := a.pipe.SwapDetector(*newDet, monotonicNow()); err != nil {
			if errors.Is(err, ErrSwapInProgress) {
				return err
			}
			return fmt.Errorf("%w: %w", ErrInvalidControl, err)
		}
		a.counters.add("detector_swaps", 1)
		a.log.Info("detector settings change at the next window boundary",
			"window", fmt.Sprintf("%s -> %s", old.Window, newDet.Window),
			"threshold", fmt.Sprintf("%g -> %g", old.Threshold, newDet.Threshold),
			"phase_thresholds", fmt.Sprintf("%v -> %v", old.PhaseThresholds, newDet.PhaseThresholds),
			"floor", fmt.Sprintf("%s -> %s", old.Floor, newDet.Floor),
			"consecutive", fmt.Sprintf("%d -> %d", old.Consecutive, newDet.Consecutive))
	}
	if req.hasDuty() {
		a.setDuty(req)
	}
	if newDet != nil && a.duty != nil && a.duty.Config().Period > newDet.Window {
		// As at start: every window needs some covered steps.
		d := a.duty.Config()
		d.Period = newDet.Window
		a.duty.SetConfig(d)
	}
	a.applyPlan()
	return nil
}

func (a *Agent) setDuty(req ControlRequest) {
	d := a.duty.Config()
	before := d
	if req.DutyBudget != nil {
		d.Budget = *req.DutyBudget
	}
	if req.DutyPeriod != nil {
		d.Period = time.Duration(*req.DutyPeriod).Round(time.Millisecond)
	}
	if req.DutyShare != nil {
		if a.control.pinned == 0 {
			a.control.minShare, a.control.maxShare = d.MinShare, d.MaxShare
		}
		a.control.pinned = *req.DutyShare
		d.MinShare, d.MaxShare = *req.DutyShare, *req.DutyShare
	}
	if req.DutyAuto && a.control.pinned != 0 {
		d.MinShare, d.MaxShare = a.control.minShare, a.control.maxShare
		a.control.pinned = 0
	}
	a.duty.SetConfig(d)
	a.counters.add("duty_changes", 1)
	a.log.Info("duty cycle changed", "budget", fmt.Sprintf("%g -> %g", before.Budget, d.Budget),
		"period", fmt.Sprintf("%s -> %s", before.Period, d.Period), "pinned_share", a.control.pinned)
}

// controlState snapshots the state (main goroutine).
func (a *Agent) controlState() ControlState {
	cfg := a.pipe.DetectorConfig()
	swap := a.pipe.SwapStatus()
	st := ControlState{
		Paused: a.att.paused,
		Detector: DetectorSettings{
			Window: Duration(cfg.Window), Threshold: cfg.Threshold, PhaseThresholds: cfg.PhaseThresholds,
			Floor: Duration(cfg.Floor), Consecutive: cfg.Consecutive, Lateness: Duration(cfg.Lateness),
		},
		DetectorSwaps: swap.Swaps,
		SwapSettling:  swap.Settling,
	}
	if st.Paused {
		st.PausedFor = Duration(time.Since(a.control.pausedAt).Round(time.Millisecond))
	}
	if a.duty != nil {
		d := a.duty.Config()
		st.Duty = &DutySettings{Budget: d.Budget, Period: Duration(d.Period), PinnedShare: a.control.pinned, MinShare: d.MinShare, MaxShare: d.MaxShare}
	}
	for _, rs := range a.pipe.LiveStats() {
		st.Records.Late += rs.Late
		st.Records.Duplicate += rs.Duplicate
		st.Records.DroppedHost += rs.DroppedHost
		st.Records.DroppedDevice += rs.DroppedDevice
	}
	for _, s := range a.pipe.Summaries() {
		st.Facts.Late += s.Late
		st.Facts.Duplicates += s.Duplicates
		st.Facts.Evicted += s.Evicted
	}
	st.Facts.LateAfterSwap = swap.LateAfterSwap
	return st
}
