// Package sim generates synthetic step-fact streams of a synchronous
// data-parallel job: N ranks, a step rate, jitter per phase, slowdowns injected
// by rank, phase, time and factor, workload variety, gaps and missing device
// timing. Tests, benchmarks and the first demo use it; users use it to learn
// the detector's semantics. It is pure: the same Config (seed included) always
// yields the same facts.
package sim

import (
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"time"

	"github.com/slowrank/slowrank/detector"
)

// Slowdown multiplies one rank's phase by Factor from From to To (To zero:
// until the end). Host slowdowns may instead add a fixed stall with AddMS.
type Slowdown struct {
	Rank   int
	Phase  string // detector.PhaseCompute or detector.PhaseHost
	From   time.Duration
	To     time.Duration
	Factor float64
	AddMS  float64
}

// Gap is a span of time with no facts at all (every rank silent). Ranks lists
// the silent ranks; empty means all.
type Gap struct {
	From, To time.Duration
	Ranks    []int
}

// Config describes the synthetic job.
type Config struct {
	Job        string
	Host       string
	Ranks      int
	Duration   time.Duration
	Step       time.Duration // nominal step time
	HostShare  float64       // share of a step spent in host work (rest compute)
	CommMS     float64       // exposed communication per step
	Jitter     float64       // relative standard deviation per phase
	Slowdowns  []Slowdown
	Gaps       []Gap
	Variety    int     // distinct workload fingerprints, cycled by step; 0: none
	Tokens     int64   // tokens per step; 0: none
	MissingGPU float64 // probability that a step has no device timing
	DPGroups   int     // emit a topology with this many dp groups; 0: none
	Seed       uint64
	StartNS    int64
}

// Default returns a small job: 8 ranks, 200 ms steps, 2 % jitter, 60 s.
func Default() Config {
	return Config{
		Job: "sim", Host: "sim0", Ranks: 8, Duration: 60 * time.Second,
		Step: 200 * time.Millisecond, HostShare: 0.2, CommMS: 4, Jitter: 0.02,
		Variety: 1, Seed: 1, StartNS: 1_000_000_000,
	}
}

// Bounds of the finite inputs: beyond them the generated times overflow.
const (
	maxFactor = 1000
	maxMS     = 3600e3 // an hour
)

// Validate reports what is wrong with c.
func (c Config) Validate() error {
	var errs []error
	if c.Job == "" {
		errs = append(errs, errors.New("job must not be empty"))
	}
	if c.Ranks < 1 || c.Ranks > 1<<20 {
		errs = append(errs, fmt.Errorf("ranks must be in [1, 1048576], got %d", c.Ranks))
	}
	if c.Step <= 0 || c.Duration < c.Step {
		errs = append(errs, fmt.Errorf("step (%s) must be positive and not longer than duration (%s)", c.Step, c.Duration))
	}
	// Written so that NaN fails every range (a NaN compares false).
	if !(c.HostShare >= 0 && c.HostShare <= 1) || !(c.Jitter >= 0 && c.Jitter <= 1) || !(c.MissingGPU >= 0 && c.MissingGPU <= 1) {
		errs = append(errs, errors.New("host share, jitter and missing-gpu must be in [0, 1]"))
	}
	if !(c.CommMS >= 0 && c.CommMS <= maxMS) {
		errs = append(errs, fmt.Errorf("comm ms must be in [0, %g], got %g", float64(maxMS), c.CommMS))
	}
	if c.DPGroups < 0 || (c.DPGroups > 0 && c.Ranks%c.DPGroups != 0) {
		errs = append(errs, fmt.Errorf("dp groups (%d) must divide ranks (%d)", c.DPGroups, c.Ranks))
	}
	for _, s := range c.Slowdowns {
		if s.Rank < 0 || s.Rank >= c.Ranks {
			errs = append(errs, fmt.Errorf("slowdown rank %d outside [0, %d)", s.Rank, c.Ranks))
		}
		if s.Phase != detector.PhaseCompute && s.Phase != detector.PhaseHost {
			errs = append(errs, fmt.Errorf("slowdown phase must be compute or host, got %q", s.Phase))
		}
		if !(s.Factor >= 0 && s.Factor <= maxFactor) || !(s.AddMS >= 0 && s.AddMS <= maxMS) {
			errs = append(errs, fmt.Errorf("slowdown factor must be in [0, %g] and add in [0, %gms], got factor %g, add %gms",
				float64(maxFactor), float64(maxMS), s.Factor, s.AddMS))
		}
	}
	return errors.Join(errs...)
}

// Generate calls emit with a topology fact (when DPGroups > 0) and then every
// step fact in time order. emit's error stops generation.
func Generate(c Config, emit func(any) error) error {
	if err := c.Validate(); err != nil {
		return fmt.Errorf("simulate: %w", err)
	}
	rng := rand.New(rand.NewPCG(c.Seed, 0x5eed))
	if c.DPGroups > 0 {
		if err := emit(topology(c)); err != nil {
			return err
		}
	}
	nominal := float64(c.Step) / 1e6
	host := make([]float64, c.Ranks)
	compute := make([]float64, c.Ranks)
	t := c.StartNS
	for k := int64(0); ; k++ {
		at := time.Duration(t - c.StartNS)
		if at+c.Step > c.Duration {
			return nil
		}
		gpu := rng.Float64() >= c.MissingGPU
		wall := 0.0
		for r := 0; r < c.Ranks; r++ {
			host[r] = nominal * c.HostShare * c.jitter(rng)
			compute[r] = nominal * (1 - c.HostShare) * c.jitter(rng)
			c.applySlowdowns(r, at, &host[r], &compute[r])
			wall = max(wall, host[r]+compute[r])
		}
		wall += c.CommMS
		end := t + int64(wall*1e6)
		for r := 0; r < c.Ranks; r++ {
			if c.silent(r, at) {
				continue
			}
			if err := emit(c.step(k, r, t, end, wall, host[r], compute[r], gpu)); err != nil {
				return err
			}
		}
		t = end
	}
}

func (c Config) jitter(rng *rand.Rand) float64 {
	return max(0.05, 1+c.Jitter*rng.NormFloat64())
}

func (c Config) applySlowdowns(r int, at time.Duration, host, compute *float64) {
	for _, s := range c.Slowdowns {
		if s.Rank != r || at < s.From || (s.To > 0 && at >= s.To) {
			continue
		}
		v := compute
		if s.Phase == detector.PhaseHost {
			v = host
		}
		if s.Factor > 0 {
			*v *= s.Factor
		}
		*v += s.AddMS
	}
}

func (c Config) silent(r int, at time.Duration) bool {
	for _, g := range c.Gaps {
		if at < g.From || at >= g.To {
			continue
		}
		if len(g.Ranks) == 0 {
			return true
		}
		for _, gr := range g.Ranks {
			if gr == r {
				return true
			}
		}
	}
	return false
}

func (c Config) step(k int64, r int, start, end int64, wall, host, compute float64, gpu bool) detector.Step {
	phases := map[string]float64{
		detector.PhaseStep:     wall,
		detector.PhaseHost:     host,
		detector.PhaseSyncWait: wall - host,
	}
	if gpu {
		phases[detector.PhaseCompute] = compute
		phases[detector.PhaseComm] = c.CommMS + (wall - c.CommMS - host - compute)
		phases[detector.PhaseExposedComm] = c.CommMS
		// Idle is the step not covered by compute or communication kernels
		// (as the correlator measures it): a rank that waits for a slower
		// peer spins in its communication kernels, so only the rank whose
		// host work is longest leaves its GPU idle for it.
		phases[detector.PhaseIdle] = wall - compute - phases[detector.PhaseComm]
	}
	s := detector.Step{
		Kind: detector.KindStep, Job: c.Job, Rank: r, Step: k, Host: c.Host,
		StartNS: start, EndNS: end, Phases: phases, GPU: gpu,
	}
	if c.DPGroups > 0 {
		s.Topo = 1
	}
	if c.Variety > 0 || c.Tokens > 0 {
		s.Workload = &detector.Workload{Tokens: c.Tokens}
		if c.Variety > 0 && gpu {
			s.Workload.FP = fingerprint(k % int64(c.Variety))
		}
	}
	return s
}

func fingerprint(v int64) string {
	h := fnv.New32a()
	_, _ = fmt.Fprintf(h, "workload-%d", v) // a hash's Write never fails
	return fmt.Sprintf("%08x", h.Sum32())
}

func topology(c Config) detector.Topology {
	t := detector.Topology{Kind: detector.KindTopology, Job: c.Job, Version: 1}
	for r := 0; r < c.Ranks; r++ {
		t.Ranks = append(t.Ranks, detector.RankInfo{Rank: r, Host: c.Host, LocalRank: r % 8})
	}
	per := c.Ranks / c.DPGroups
	for g := 0; g < c.DPGroups; g++ {
		grp := detector.Group{ID: fmt.Sprintf("dp%d", g), Type: "dp"}
		for r := g * per; r < (g+1)*per; r++ {
			grp.Ranks = append(grp.Ranks, r)
		}
		t.Groups = append(t.Groups, grp)
	}
	return t
}
