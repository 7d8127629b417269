package detector

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"
)

// Config holds the detector's tunables. The zero value is not valid; start
// from DefaultConfig.
type Config struct {
	// Window is the length of an evaluation window in event time.
	Window time.Duration
	// Threshold is the relative deviation at or above which a window is slow.
	Threshold float64
	// PhaseThresholds overrides Threshold for the phases it names.
	PhaseThresholds map[string]float64
	// Exposure gates the host phase by evidence that its excess lengthens a
	// step (DESIGN.md section 4): host time that hides behind queued GPU work
	// is not a straggler. Off, every phase follows the seed's rule alone.
	Exposure bool
	// CarryWindows is how many windows a slow window's direct exposure
	// evidence (GPU idle, slack) stands for the same deviation in windows
	// without any, and how many windows in which nobody measured a phase
	// keep a candidate's streak (0: none). Device records come in
	// duty-cycle on-phases, so a persisting stall would otherwise lose its
	// streak in the windows between them.
	CarryWindows int
	// Floor is the absolute difference below which no window is slow,
	// whatever the relative deviation.
	Floor time.Duration
	// Consecutive is the number of consecutive slow windows that turn a
	// candidate into a straggler.
	Consecutive int
	// MinReferences is the number of comparable members a rank needs for a
	// valid comparison; fewer gives an uncertain verdict.
	MinReferences int
	// TokenTolerance is the relative difference of token counts within which
	// two workloads are comparable.
	TokenTolerance float64
	// Phases are the phases evaluated, in output order.
	Phases []string
	// CohortType is the topology group type that forms cohorts. Ranks outside
	// any such group form one cohort of type "world".
	CohortType string
	// Lateness is how long after a window's end (in event time) the window
	// waits for late facts before it is settled.
	Lateness time.Duration
	// EvictAfter is the number of windows without facts after which a rank's
	// state is evicted.
	EvictAfter int
	// MaxRanks bounds the ranks tracked per job.
	MaxRanks int
	// MaxTotalRanks bounds the ranks tracked over all jobs (about 1 KiB
	// of state each): a topology names ranks that may never send a fact,
	// and the jobs and their topologies come from processes any local user
	// can start.
	MaxTotalRanks int
	// MaxJobs bounds the jobs tracked.
	MaxJobs int
	// EmitOK also emits verdicts for plain ok evaluations.
	EmitOK bool
}

// MaxListedComparable bounds Verdict.ComparableRanks; ComparableCount has the
// full number.
const MaxListedComparable = 64

// DefaultConfig returns the defaults of DESIGN.md section 4.
func DefaultConfig() Config {
	return Config{
		Window:         5 * time.Second,
		Threshold:      0.05,
		Exposure:       true,
		CarryWindows:   3,
		Floor:          time.Millisecond,
		Consecutive:    3,
		MinReferences:  1,
		TokenTolerance: 0.02,
		Phases:         []string{PhaseCompute, PhaseHost},
		CohortType:     "dp",
		Lateness:       2 * time.Second,
		EvictAfter:     60,
		MaxRanks:       1 << 17,
		MaxTotalRanks:  1 << 19,
		MaxJobs:        256,
	}
}

// Validate reports the first invalid field, naming it.
func (c Config) Validate() error {
	var errs []error
	if c.Window <= 0 {
		errs = append(errs, fmt.Errorf("window must be positive, got %s", c.Window))
	}
	if !(c.Threshold > 0 && c.Threshold < 1) {
		errs = append(errs, fmt.Errorf("threshold must be a fraction in (0, 1), got %g", c.Threshold))
	}
	for _, ph := range slices.Sorted(maps.Keys(c.PhaseThresholds)) {
		t := c.PhaseThresholds[ph]
		if !slices.Contains(c.Phases, ph) {
			errs = append(errs, fmt.Errorf("phase threshold names %q, which is not an evaluated phase %q", ph, c.Phases))
		}
		if !(t > 0 && t < 1) {
			errs = append(errs, fmt.Errorf("threshold of phase %q must be a fraction in (0, 1), got %g", ph, t))
		}
	}
	if c.Floor < 0 {
		errs = append(errs, fmt.Errorf("floor must not be negative, got %s", c.Floor))
	}
	if c.CarryWindows < 0 {
		errs = append(errs, fmt.Errorf("carry windows must not be negative, got %d", c.CarryWindows))
	}
	if c.Consecutive < 1 {
		errs = append(errs, fmt.Errorf("consecutive must be at least 1, got %d", c.Consecutive))
	}
	if c.MinReferences < 1 {
		errs = append(errs, fmt.Errorf("min references must be at least 1, got %d", c.MinReferences))
	}
	if c.TokenTolerance < 0 || c.TokenTolerance >= 1 {
		errs = append(errs, fmt.Errorf("token tolerance must be in [0, 1), got %g", c.TokenTolerance))
	}
	if len(c.Phases) == 0 {
		errs = append(errs, errors.New("at least one phase must be evaluated"))
	}
	seen := map[string]bool{}
	for _, p := range c.Phases {
		if p == "" || seen[p] {
			errs = append(errs, fmt.Errorf("phases must be distinct and non-empty, got %q", c.Phases))
			break
		}
		seen[p] = true
	}
	if c.Lateness < 0 {
		errs = append(errs, fmt.Errorf("lateness must not be negative, got %s", c.Lateness))
	}
	if c.EvictAfter < 1 {
		errs = append(errs, fmt.Errorf("evict-after must be at least 1 window, got %d", c.EvictAfter))
	}
	if c.MaxRanks < 1 || c.MaxJobs < 1 || c.MaxTotalRanks < 1 {
		errs = append(errs, fmt.Errorf("max ranks, max total ranks and max jobs must be positive, got %d, %d and %d",
			c.MaxRanks, c.MaxTotalRanks, c.MaxJobs))
	}
	return errors.Join(errs...)
}

// exposureGated reports whether phase needs exposure evidence to be slow.
// Only host is gated: host time can hide behind GPU work that is already
// queued. Compute is GPU time on the rank's own stream, which every peer's
// collective waits for (see DESIGN.md section 4 for why it is not gated).
func (c Config) exposureGated(phase string) bool {
	return c.Exposure && phase == PhaseHost
}

// PhaseThreshold is the relative deviation that makes a window slow in phase.
func (c Config) PhaseThreshold(phase string) float64 {
	if t, ok := c.PhaseThresholds[phase]; ok {
		return t
	}
	return c.Threshold
}
