package main

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/slowrank/slowrank/agent/duty"
	"github.com/slowrank/slowrank/detector"
)

// detectorFlags are shared by every command that runs the detector.
func detectorFlags() []cli.Flag {
	d := detector.DefaultConfig()
	return []cli.Flag{
		&cli.DurationFlag{Name: "window", Value: d.Window, Usage: "evaluation window of event time", EnvVars: []string{"SLOWRANK_WINDOW"}},
		&cli.Float64Flag{Name: "threshold", Value: d.Threshold, Usage: "relative deviation from the fastest comparable rank that makes a window slow, a fraction in (0, 1): 0.05 is 5 %", EnvVars: []string{"SLOWRANK_THRESHOLD"}},
		&cli.StringFlag{Name: "phase-threshold", Usage: "per-phase thresholds that override --threshold, e.g. host=0.1", EnvVars: []string{"SLOWRANK_PHASE_THRESHOLD"}},
		&cli.StringFlag{Name: "exposure", Value: "on", Usage: "on: a host deviation is slow only as far as evidence shows it lengthens a step (GPU idle, its own slack against its peers' waits, peers' collective waits, or the job's step time against its recent past, attributed to the rank whose host grew); off: the seed's rule alone (see docs/verdicts.md)", EnvVars: []string{"SLOWRANK_EXPOSURE"}},
		&cli.DurationFlag{Name: "floor", Value: d.Floor, Usage: "absolute difference below which a relative deviation never makes a window slow", EnvVars: []string{"SLOWRANK_FLOOR"}},
		&cli.IntFlag{Name: "consecutive", Value: d.Consecutive, Usage: "consecutive slow windows before a straggler alert", EnvVars: []string{"SLOWRANK_CONSECUTIVE"}},
		&cli.IntFlag{Name: "carry-windows", Value: d.CarryWindows, Usage: "windows for which a slow window's GPU-idle or slack evidence stands for the same host deviation where nothing else decides (device records come in duty-cycle on-phases); 0: off", EnvVars: []string{"SLOWRANK_CARRY_WINDOWS"}},
		&cli.IntFlag{Name: "min-references", Value: d.MinReferences, Usage: "comparable ranks needed for a valid comparison", EnvVars: []string{"SLOWRANK_MIN_REFERENCES"}},
		&cli.Float64Flag{Name: "token-tolerance", Value: d.TokenTolerance, Usage: "relative token-count difference within which workloads are comparable", EnvVars: []string{"SLOWRANK_TOKEN_TOLERANCE"}},
		&cli.StringFlag{Name: "phases", Value: strings.Join(d.Phases, ","), Usage: "comma-separated phases to evaluate (step, compute, host, sync_wait, comm, exposed_comm, coll_wait, idle, attention, moe)", EnvVars: []string{"SLOWRANK_PHASES"}},
		&cli.StringFlag{Name: "cohort-type", Value: d.CohortType, Usage: "topology group type that forms cohorts (ranks outside such groups form one world cohort)", EnvVars: []string{"SLOWRANK_COHORT_TYPE"}},
		&cli.DurationFlag{Name: "lateness", Value: d.Lateness, Usage: "how long a window waits for late facts before it is settled", EnvVars: []string{"SLOWRANK_LATENESS"}},
		&cli.IntFlag{Name: "evict-after", Value: d.EvictAfter, Usage: "windows of silence after which a rank's state is evicted", EnvVars: []string{"SLOWRANK_EVICT_AFTER"}},
		&cli.BoolFlag{Name: "emit-ok", Usage: "also emit verdicts for plain ok evaluations", EnvVars: []string{"SLOWRANK_EMIT_OK"}},
	}
}

// detectorConfig builds and validates the detector configuration from flags.
func detectorConfig(c *cli.Context) (detector.Config, error) {
	cfg := detector.DefaultConfig()
	cfg.Window = c.Duration("window")
	if cfg.Window < duty.MinWindow {
		return cfg, cli.Exit(fmt.Sprintf("--window must be at least %s (the shortest duty period of device collection), got %s", duty.MinWindow, cfg.Window), exitUsage)
	}
	cfg.Threshold = c.Float64("threshold")
	if err := checkThreshold(c, "threshold", cfg.Threshold); err != nil {
		return cfg, err
	}
	pt, err := parsePhaseThresholds(c.String("phase-threshold"))
	if err != nil {
		return cfg, cli.Exit(fmt.Sprintf("invalid --phase-threshold: %v", err), exitUsage)
	}
	for _, ph := range slices.Sorted(maps.Keys(pt)) {
		if err := checkThreshold(c, "phase-threshold", pt[ph], ph); err != nil {
			return cfg, err
		}
	}
	cfg.PhaseThresholds = pt
	switch e := strings.TrimSpace(c.String("exposure")); e {
	case "on":
		cfg.Exposure = true
	case "off":
		cfg.Exposure = false
	default:
		return cfg, cli.Exit(fmt.Sprintf("invalid --exposure %q: want on or off", e), exitUsage)
	}
	cfg.Floor = c.Duration("floor")
	cfg.Consecutive = c.Int("consecutive")
	cfg.CarryWindows = c.Int("carry-windows")
	cfg.MinReferences = c.Int("min-references")
	cfg.TokenTolerance = c.Float64("token-tolerance")
	if cfg.Phases, err = parsePhases(c); err != nil {
		return cfg, err
	}
	cfg.CohortType = c.String("cohort-type")
	cfg.Lateness = c.Duration("lateness")
	cfg.EvictAfter = c.Int("evict-after")
	cfg.EmitOK = c.Bool("emit-ok")
	if err := cfg.Validate(); err != nil {
		return cfg, cli.Exit(fmt.Sprintf("invalid detector flags: %s", strings.ReplaceAll(err.Error(), "\n", "; ")), exitUsage)
	}
	return cfg, nil
}

// checkThreshold refuses a relative threshold outside (0, 1): the flag
// takes a fraction, and 5 meant as "5 %" would read as 500 %. With phase,
// value is that phase's override in --phase-threshold. The value may come
// from the flag, its environment variable or --config: the message names
// the flag and the variable.
func checkThreshold(c *cli.Context, flag string, value float64, phase ...string) error {
	if value > 0 && value < 1 {
		return nil
	}
	given := strconv.FormatFloat(value, 'g', -1, 64)
	if len(phase) > 0 {
		given = phase[0] + "=" + given
	}
	return cli.Exit(fmt.Sprintf("invalid --%s %s: want a fraction in (0, 1), e.g. 0.05 for 5 %%%s", flag, given, flagSources(c, flag)), exitUsage)
}

// parsePhases reads --phases: distinct names of detector.PhaseNames.
func parsePhases(c *cli.Context) ([]string, error) {
	known := detector.PhaseNames()
	var out []string
	for _, p := range strings.Split(c.String("phases"), ",") {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		if !slices.Contains(known, p) {
			return nil, cli.Exit(fmt.Sprintf("invalid --phases: unknown phase %q (want a comma-separated list of %s)%s",
				p, strings.Join(known, ", "), flagSources(c, "phases")), exitUsage)
		}
		out = append(out, p)
	}
	return out, nil
}

// flagSources says where the value of a flag of the running command may
// have come from: the flag, its environment variables, --config.
func flagSources(c *cli.Context, name string) string {
	from := []string{"the flag"}
	for _, f := range c.Command.Flags {
		if ev, ok := f.(interface{ GetEnvVars() []string }); ok && slices.Contains(f.Names(), name) {
			from = append(from, ev.GetEnvVars()...)
		}
	}
	if configurable[c.Command.Name] {
		from = append(from, "--config")
	}
	if len(from) == 1 {
		return ""
	}
	return " (set by " + strings.Join(from[:len(from)-1], ", ") + " or " + from[len(from)-1] + ")"
}

// parsePhaseThresholds reads "phase=value[,phase=value...]".
func parsePhaseThresholds(s string) (map[string]float64, error) {
	var out map[string]float64
	for _, item := range strings.Split(s, ",") {
		if item = strings.TrimSpace(item); item == "" {
			continue
		}
		phase, val, ok := strings.Cut(item, "=")
		phase = strings.TrimSpace(phase)
		if !ok || phase == "" {
			return nil, fmt.Errorf("%q is not PHASE=VALUE (e.g. host=0.15)", item)
		}
		t, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil {
			return nil, fmt.Errorf("%q: the value is not a number", item)
		}
		if _, dup := out[phase]; dup {
			return nil, fmt.Errorf("phase %q is given twice", phase)
		}
		if out == nil {
			out = map[string]float64{}
		}
		out[phase] = t
	}
	return out, nil
}

// durationMS formats milliseconds for humans.
func durationMS(ms float64) string {
	return time.Duration(ms * float64(time.Millisecond)).Round(10 * time.Microsecond).String()
}
