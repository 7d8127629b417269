package duty

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/slowrank/slowrank/detector"
)

// dutySim runs a synchronous training job against a Ledger: step times with
// jitter, a true cost of device collection on the covered part of each step,
// the library's time-based duty cycle and escalations as the plans ask, a
// plan every second as the agent makes.
type dutySim struct {
	d      *Ledger
	cfg    Config
	rng    *rand.Rand
	ranks  int
	baseMS float64
	jitter float64 // relative standard deviation of a step
	cost   float64 // true cost of full collection
	// slow is the job's own slowdown factor at t (nil: none).
	slow func(t int64) float64
	// traps is uprobe traps per second and process at t (nil: none).
	traps func(t int64) float64
	// suspect, when set, is asked every second whether a window turns
	// suspicious now; Suspect gets the last 5 s as the window.
	suspect   func(t int64) bool
	onSuspect func(t int64, granted bool)
	// pluginOps is the NCCL plugin's operations per second and process
	// (0: no plugin), kchCost the true cost of its kernel-channel events
	// on the covered part of a step while the plan has them on.
	pluginOps, kchCost float64
	// onStep, when set, sees each step's end and whether collection
	// covered all of it.
	onStep func(end int64, gpu bool)

	now      int64
	steps    int64 // steps run
	nextPlan int64
	plan     Plan
	escFrom  int64 // when the escalating plan was applied
	// true spend: seconds of slowdown from collection, and training seconds
	trueDevice, train float64
}

const simStart = int64(1000 * time.Second)

func newDutySim(cfg Config, seed uint64) *dutySim {
	s := &dutySim{d: New(cfg), cfg: cfg, rng: rand.New(rand.NewPCG(seed, 7)), ranks: 4, baseMS: 57, jitter: 0.01,
		now: simStart, nextPlan: simStart}
	s.plan = s.d.Plan(simStart)
	s.nextPlan += int64(time.Second)
	return s
}

// onTime is how long collection is on in [a, b).
func (s *dutySim) onTime(a, b int64) int64 {
	segs := [][2]int64{{a, b}}
	total := int64(0)
	if s.plan.Escalate {
		ea, eb := max(a, s.escFrom), min(b, s.plan.EscalatedUntil)
		if ea < eb {
			total += eb - ea
			segs = [][2]int64{{a, ea}, {eb, b}}
		}
	}
	p := int64(s.plan.Period)
	on := int64(time.Duration(float64(s.plan.Period) * s.plan.OnShare).Round(time.Millisecond))
	if s.plan.OnShare >= 1 {
		on = p
	}
	for _, g := range segs {
		if g[1] <= g[0] || on <= 0 {
			continue
		}
		for k := g[0] / p; k*p < g[1]; k++ {
			if lo, hi := max(g[0], k*p), min(g[1], k*p+on); hi > lo {
				total += hi - lo
			}
		}
	}
	return total
}

// run simulates d of training.
func (s *dutySim) run(d time.Duration) {
	end := s.now + int64(d)
	for s.now < end {
		f := 1.0
		if s.slow != nil {
			f = s.slow(s.now)
		}
		d0 := int64(s.baseMS * f * (1 + s.jitter*s.rng.NormFloat64()) * 1e6)
		covered := float64(s.onTime(s.now, s.now+d0)) / float64(d0)
		cost := s.cost
		if s.pluginOps > 0 && s.plan.KernelChannels {
			cost += s.kchCost
		}
		dur := int64(float64(d0) * (1 + cost*covered))
		gpu := s.onTime(s.now, s.now+dur) == dur
		s.trueDevice += float64(dur-d0) / 1e9
		s.train += float64(dur) / 1e9
		s.now += dur
		s.steps++
		if s.onStep != nil {
			s.onStep(s.now, gpu)
		}
		for r := 0; r < s.ranks; r++ {
			s.d.ObserveStep(stepFact(r, s.steps, s.now, float64(dur)/1e6*(1+0.001*s.rng.NormFloat64()), 0, gpu))
		}
		for s.nextPlan <= s.now {
			t := s.nextPlan
			if s.traps != nil {
				s.d.ObserveTraps(t, Traps{Total: s.traps(t)})
			}
			s.d.ObservePluginOps(t, s.pluginOps)
			if s.suspect != nil && s.suspect(t) {
				ok := s.d.Suspect(t, t-int64(5*time.Second), t)
				if s.onSuspect != nil {
					s.onSuspect(t, ok)
				}
			}
			was := s.plan.Escalate && t < s.plan.EscalatedUntil
			s.plan = s.d.Plan(t)
			if s.plan.Escalate && !was {
				s.escFrom = t
			}
			s.nextPlan += int64(time.Second)
		}
	}
}

// stepFact is a rank's step fact as the pipeline hands it to the duty
// cycle: its wall time and the host's wait for the device, in ms.
func stepFact(rank int, step, end int64, ms, waitMS float64, gpu bool) detector.Step {
	return detector.Step{Rank: rank, Step: step, EndNS: end, GPU: gpu,
		Phases: map[string]float64{detector.PhaseStep: ms, detector.PhaseSyncWait: waitMS}}
}

func TestDutyUsesPriorUntilMeasured(t *testing.T) {
	cfg := DefaultConfig()
	d := New(cfg)
	p := d.Plan(simStart)
	want := (cfg.Budget*(1-cfg.EscalationReserve) - cfg.LibraryCost) / cfg.PriorCost
	if p.Measured || p.Overhead.Cost.Measured || math.Abs(p.OnShare-want) > 1e-9 {
		t.Fatalf("prior plan = %+v, want share %g", p, want)
	}
}

func TestDutyEstimateRecoversInjectedCost(t *testing.T) {
	for _, tc := range []struct {
		name string
		cost float64
	}{
		{"no cost", 0},
		{"2 % on covered steps", 0.02},
		{"8 % on covered steps", 0.08},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newDutySim(DefaultConfig(), 1)
			s.cost = tc.cost
			s.run(15 * time.Minute)
			e := s.d.Estimate()
			if !e.Measured || e.Pairs < s.cfg.MinPairs {
				t.Fatalf("estimate %+v not measured", e)
			}
			if !(e.Low <= tc.cost && tc.cost <= e.High) || e.High-e.Low > 0.005 {
				t.Fatalf("estimate %+v: interval misses the injected %g or is wider than 0.5 %%", e, tc.cost)
			}
			// Collection before the estimate was measured was charged at
			// the prior; the ledger trues it up.
			if o := s.d.Plan(s.now).Overhead; o.Device < s.trueDevice/s.train {
				t.Fatalf("ledger charged %.5f for device collection, true cost %.5f", o.Device, s.trueDevice/s.train)
			}
		})
	}
}

func TestDutyJobSlowdownIsNotCost(t *testing.T) {
	period := int64(DefaultConfig().Period)
	for _, tc := range []struct {
		name string
		cfg  func(*Config)
		slow func(t int64) float64
		// suspect: escalations at these offsets into each 100 s
		suspectEvery time.Duration
		wantDrops    func(PairDrops) bool
	}{
		{
			name: "a lasting slowdown that starts inside on-blocks",
			// Every third period the job turns 10 % slower 100 ms into the
			// on-block, and recovers mid-way through the next off time.
			slow: func(t int64) float64 {
				pos := (t - simStart) % (3 * period)
				if pos >= period+int64(100*time.Millisecond) && pos < period+period/2 {
					return 1.1
				}
				return 1
			},
			wantDrops: func(d PairDrops) bool { return d.Drift > 0 },
		},
		{
			name: "a stall that fills an on-block",
			// One block in 16 is stalled 40 % for most of its length.
			slow: func(t int64) float64 {
				if pos := (t - simStart) % (16 * period); pos < int64(500*time.Millisecond) {
					return 1.4
				}
				return 1
			},
			wantDrops: func(PairDrops) bool { return true },
		},
		{
			name: "a slowdown during each escalation",
			// A budget that pays for every escalation; the job is 20 %
			// slower from 2 s to 18 s into each one.
			cfg:          func(c *Config) { c.Budget = 0.05 },
			suspectEvery: 100 * time.Second,
			slow: func(t int64) float64 {
				if pos := (t - simStart) % int64(100*time.Second); pos > int64(2*time.Second) && pos < int64(18*time.Second) {
					return 1.2
				}
				return 1
			},
			wantDrops: func(d PairDrops) bool { return d.Suspect > 0 },
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			if tc.cfg != nil {
				tc.cfg(&cfg)
			}
			// The job starts at the period boundary: on-blocks begin
			// at simStart + k·period.
			s := newDutySim(cfg, 2)
			s.cost, s.slow = 0.02, tc.slow
			refused := 0
			if tc.suspectEvery > 0 {
				s.suspect = func(t int64) bool { return (t-simStart)%int64(tc.suspectEvery) == 0 && t > simStart }
				s.onSuspect = func(_ int64, ok bool) {
					if !ok {
						refused++
					}
				}
			}
			s.run(20 * time.Minute)
			e := s.d.Estimate()
			if !e.Measured || !(e.Low <= s.cost && s.cost <= e.High) || math.Abs(e.Cost-s.cost) > 0.003 {
				t.Fatalf("estimate %+v, want the injected %g within its interval and 0.3 %%", e, s.cost)
			}
			if !tc.wantDrops(s.d.drops) || refused > 0 {
				t.Fatalf("drops %+v, %d escalations refused", s.d.drops, refused)
			}
		})
	}
}

func TestDutySuspicionDropsItsPairs(t *testing.T) {
	// One rank: blocks of 5 steps 2 % slower than the 10 off steps around
	// them; block 6 falls into a job slowdown (+50 %) that the detector
	// flags, before or after the block is paired.
	for _, tc := range []struct {
		name      string
		suspectAt int // step index of the Suspect call
	}{
		{"suspicion settled before the block is paired", 6*15 + 12},
		{"suspicion settled after the block is paired", 6*15 + 40},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Advance = 0 // no escalation: its own span would be excluded too
			d := New(cfg)
			now := simStart
			var from, to int64
			for i := 0; i < 15*12; i++ {
				block, pos := i/15, i%15
				ms, on := 100.0, pos >= 10
				if on {
					ms = 102
					if block == 6 {
						ms = 150
						if from == 0 {
							from = now
						}
						to = now + 150e6
					}
				}
				now += int64(ms * 1e6)
				d.ObserveStep(stepFact(0, int64(i), now, ms, 0, on))
				if i == tc.suspectAt {
					d.Suspect(now, from, to)
				}
			}
			e := d.Estimate()
			if e.Pairs != 10 || d.drops.Suspect != 1 || math.Abs(e.Cost-0.02) > 1e-9 {
				t.Fatalf("estimate %+v, drops %+v: want the 10 clean blocks at 2 %%", e, d.drops)
			}
		})
	}
}

func TestDutyShareFollowsUpperBound(t *testing.T) {
	for _, tc := range []struct {
		name     string
		jitter   float64
		wantFull bool
	}{
		{"a noisy estimate near zero keeps a small share", 0.04, false},
		{"a quiet estimate near zero allows the largest share", 0.001, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Advance = 0 // the share after the first minutes' calibration
			s := newDutySim(cfg, 3)
			s.jitter = tc.jitter
			s.run(5 * time.Minute)
			e := s.d.Estimate()
			p := s.d.Plan(s.now)
			if !e.Measured || math.Abs(e.Cost) > 3*(e.High-e.Low) {
				t.Fatalf("estimate %+v: not a measured estimate near zero", e)
			}
			full := p.OnShare >= cfg.MaxShare
			if full != tc.wantFull {
				t.Fatalf("share %g (max %g) with estimate %+v: full = %v, want %v", p.OnShare, cfg.MaxShare, e, full, tc.wantFull)
			}
			if want := (cfg.Budget*(1-cfg.EscalationReserve) - cfg.LibraryCost) / e.High; !full && math.Abs(p.OnShare-want) > 1e-9 {
				t.Fatalf("share %g, want budget / upper bound = %g", p.OnShare, want)
			}
		})
	}
}

// TestDutyEscalationsPaidByLedger: a candidate window every 30 s, as in
// the healthy two-H200 run. The first is granted from the budget of the
// first Advance of training; the next ones are refused, with the reason,
// until the ledger has paid for the first; grants never come back to back,
// and the spend over the hour stays within the budget.
func TestDutyEscalationsPaidByLedger(t *testing.T) {
	cfg := DefaultConfig()
	s := newDutySim(cfg, 4)
	s.cost = 0.02
	type attempt struct {
		at time.Duration
		ok bool
	}
	var got []attempt
	var reason string
	s.suspect = func(t int64) bool { return (t-simStart)%int64(30*time.Second) == 0 && t > simStart }
	s.onSuspect = func(t int64, ok bool) {
		got = append(got, attempt{time.Duration(t - simStart), ok})
		if !ok && reason == "" {
			reason = s.d.Plan(t).Overhead.Refused
		}
	}
	s.run(time.Hour)
	granted, refused := 0, 0
	var grants []time.Duration
	for _, a := range got {
		if a.ok {
			granted++
			grants = append(grants, a.at)
		} else {
			refused++
		}
	}
	o := s.d.Plan(s.now).Overhead
	if !got[0].ok {
		t.Fatalf("the first escalation, 30 s into the run, was refused: %s", reason)
	}
	if got[1].ok && got[1].at-got[0].at < cfg.Escalation {
		t.Fatalf("attempts %v: the second was granted while the first ran", got[:2])
	}
	if granted < 2 || refused == 0 || int64(granted) != o.EscalationsGranted || int64(refused) != o.EscalationsRefused {
		t.Fatalf("granted %d, refused %d (overhead %+v): want refusals and grants again later", granted, refused, o)
	}
	if !strings.Contains(reason, "the ledger pays for") || !strings.Contains(reason, "left of") {
		t.Fatalf("refusal reason %q: want what the ledger can pay and what is left", reason)
	}
	for i := 1; i < len(grants); i++ {
		if grants[i]-grants[i-1] < 2*cfg.Escalation {
			t.Fatalf("grants at %v: back to back, the ledger did not pay for them", grants)
		}
	}
	if o.Total > cfg.Budget {
		t.Fatalf("spent %g of training time, budget %g", o.Total, cfg.Budget)
	}
}

func TestDutyUprobeSpendReducesBaseShare(t *testing.T) {
	cfg := DefaultConfig()
	base := cfg.Budget*(1-cfg.EscalationReserve) - cfg.LibraryCost
	for _, tc := range []struct {
		name      string
		perSecond float64
		wantShare float64
	}{
		{"no traps", 0, base / cfg.PriorCost},
		{"100 traps/s", 100, (base - 100*6e-6) / cfg.PriorCost},
		{"300 traps/s", 300, (base - 300*6e-6) / cfg.PriorCost},
		{"traps beyond the budget leave no share", 600, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := New(cfg)
			var p Plan
			for i := int64(0); i <= 120; i++ {
				now := simStart + i*int64(time.Second)
				d.ObserveStep(stepFact(0, i, now, 1000, 0, false))
				d.ObserveTraps(now, Traps{Total: tc.perSecond})
				p = d.Plan(now)
			}
			if math.Abs(p.OnShare-tc.wantShare) > 1e-9 {
				t.Fatalf("share %g, want %g (overhead %+v)", p.OnShare, tc.wantShare, p.Overhead)
			}
			if got := p.Overhead.Uprobes; math.Abs(got-tc.perSecond*6e-6) > 1e-4 {
				t.Fatalf("uprobe spend %g, want %g", got, tc.perSecond*6e-6)
			}
		})
	}
}

// TestDutySpendWithinBudget: over random jobs (step times, noise, true cost,
// uprobe traps, the job's own slowdowns and suspicions), the ledger's spend
// over a simulated hour stays within the budget, and so does the true cost.
func TestDutySpendWithinBudget(t *testing.T) {
	for seed := uint64(1); seed <= 6; seed++ {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 99))
			cfg := DefaultConfig()
			s := newDutySim(cfg, seed)
			s.ranks = 1 + rng.IntN(4)
			s.baseMS = 30 + 170*rng.Float64()
			s.jitter = 0.002 + 0.03*rng.Float64()
			s.cost = 0.08 * rng.Float64()
			trapLevels := []float64{0, 50 + 250*rng.Float64(), 100 * rng.Float64()}
			s.traps = func(t int64) float64 { return trapLevels[(t/int64(7*time.Minute))%3] }
			slowAt := int64(rng.IntN(50)) * int64(time.Minute)
			s.slow = func(t int64) float64 {
				if t-simStart > slowAt && t-simStart < slowAt+int64(3*time.Minute) {
					return 1.3
				}
				return 1
			}
			pSuspect := rng.Float64() / 10
			s.suspect = func(int64) bool { return rng.Float64() < pSuspect }
			s.run(time.Hour)
			o := s.d.Plan(s.now).Overhead
			if o.Total > cfg.Budget*1.001 {
				t.Fatalf("ledger spent %.5f (%+v), budget %g", o.Total, o, cfg.Budget)
			}
			if spent := s.trueDevice/s.train + o.Uprobes + o.Library; spent > cfg.Budget*1.05 {
				t.Fatalf("true spend %.5f, ledger %.5f, budget %g (cost %g, estimate %+v)", spent, o.Total, cfg.Budget, s.cost, o.Cost)
			}
		})
	}
}

// TestDutyOnBlocksHoldWholeSteps: when the share leaves blocks shorter than
// MinOnSteps+1 steps, the period doubles until they hold them (a block
// shorter than a step covers no step and pairs nothing); a share that
// allows them keeps the configured period.
func TestDutyOnBlocksHoldWholeSteps(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Advance = 0 // the periods after the first minutes' calibration
	for _, tc := range []struct {
		name   string
		stepMS float64
		traps  float64 // per second and process
		want   time.Duration
	}{
		{"short steps, no traps: the configured period", 57, 0, 10 * time.Second},
		{"dense 82 ms steps, 300 traps/s", 82, 300, 40 * time.Second},
		{"GPU-bound 248 ms steps, 300 traps/s", 248, 300, 160 * time.Second},
		{"2 s steps, 300 traps/s: at most MaxPeriod", 2000, 300, 640 * time.Second},
		{"traps beyond the budget: no share, the configured period", 248, 600, 10 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := New(cfg)
			var p Plan
			for i := int64(0); i <= 120; i++ {
				now := simStart + i*int64(time.Second)
				d.ObserveStep(stepFact(0, i, now, tc.stepMS, 0, false))
				d.ObserveTraps(now, Traps{Total: tc.traps})
				p = d.Plan(now)
			}
			// The smallest doubling that holds the steps, or the one
			// above it that a share falling through while the ledger
			// filled left in force (hysteresis).
			if p.Period != tc.want && (p.Period != 2*tc.want || 2*tc.want > cfg.MaxPeriod) {
				t.Fatalf("period %s, want %s (share %.4f)", p.Period, tc.want, p.OnShare)
			}
			if block := time.Duration(float64(p.Period) * p.OnShare); p.OnShare > 0 && p.Period < cfg.MaxPeriod/2 &&
				block < time.Duration(float64(cfg.MinOnSteps+1)*tc.stepMS*1e6) {
				t.Fatalf("on-block %s holds fewer than %d steps of %g ms", block, cfg.MinOnSteps+1, tc.stepMS)
			}
		})
	}
}

// TestDutyMeasuresGPUBoundJobs: a job of 248 ms steps whose uprobes take most
// of the budget (the H200's GPU-bound shape: 0.8 % on-share) gets its cost
// measured within 40 minutes; with the fixed 10-s period its 80-ms blocks
// never held a whole step.
func TestDutyMeasuresGPUBoundJobs(t *testing.T) {
	for _, tc := range []struct {
		name     string
		minSteps int
		measured bool
	}{
		{"blocks sized in steps", DefaultConfig().MinOnSteps, true},
		{"fixed period (MinOnSteps 0)", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.MinOnSteps = tc.minSteps
			s := newDutySim(cfg, 3)
			s.ranks, s.baseMS, s.cost = 1, 248, 0.01
			s.traps = func(int64) float64 { return 300 }
			s.run(40 * time.Minute)
			e := s.d.Estimate()
			if e.Measured != tc.measured {
				t.Fatalf("estimate %+v (period %s, share %.4f, drops %+v), want measured %v", e, s.plan.Period,
					s.plan.OnShare, s.d.drops, tc.measured)
			}
			if tc.measured && !(e.Low <= s.cost && s.cost <= e.High) {
				t.Fatalf("estimate %+v misses the injected cost %g", e, s.cost)
			}
			if o := s.d.Plan(s.now).Overhead; o.Total > cfg.Budget*1.001 {
				t.Fatalf("ledger spent %.5f, budget %g", o.Total, cfg.Budget)
			}
		})
	}
}

// TestDutyChargesTrapsTheHostsWaitDoesNotHide: trap time that the host's
// lead over the device in the same steps covers is not charged; the waits'
// own traps always are, a few long waits hide nothing, and device records
// that show the device waiting for the host hide nothing either.
func TestDutyChargesTrapsTheHostsWaitDoesNotHide(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Advance = 0 // the base share, not the first minutes' calibration
	c := cfg.UprobeCost.Seconds()
	every := func(ms float64) func(int, int) float64 { return func(int, int) float64 { return ms } }
	for _, tc := range []struct {
		name            string
		stepMS          float64
		ranks           int
		wait            func(rank, i int) float64 // sync_wait of the i-th step, ms
		idle            float64                   // > 0: every step collected, the device idle for this share of it
		traps, critical float64                   // per second
		wantSpend       float64                   // uprobe spend, fraction of training time
	}{
		{"kernel-dense shape: the wait hides all but the waits' own traps", 82, 1, every(30), 0, 512, 24, 24 * c},
		{"no wait: every trap is charged", 82, 1, every(0), 0, 512, 24, 512 * c},
		{"a wait shorter than the traps: the rest is charged", 10, 1, every(3), 0, 60000, 0, 60000*c - 100*3e-3},
		{"uncollected, a wait of a tenth of the step may be work queued last: nothing is hidden", 82, 1, every(8), 0, 512, 24, 512 * c},
		{"collected, the device busy all along: a wait of a tenth of the step hides", 82, 1, every(8), 0.05, 512, 24, 24 * c},
		{"collected, the device waiting for the host: nothing is hidden", 82, 1, every(30), 0.2, 512, 24, 512 * c},
		{"one of 8 ranks without a wait: it sets the step, nothing is hidden", 82, 8, func(r, _ int) float64 {
			if r == 5 {
				return 0
			}
			return 30
		}, 0, 512, 24, 512 * c},
		{"the last rank to arrive changes every step: nothing is hidden", 82, 4, func(r, i int) float64 {
			if r == i%4 {
				return 0
			}
			return 30
		}, 0, 512, 24, 512 * c},
		{"a long wait every 8th step hides nothing", 82, 1, func(_, i int) float64 {
			if i%8 == 0 {
				return 60
			}
			return 0
		}, 0, 512, 24, 512 * c},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := New(cfg)
			var p Plan
			now, i := simStart, 0
			for sec := 1; sec <= 120; sec++ {
				for end := simStart + int64(sec)*int64(time.Second); now+int64(tc.stepMS*1e6) <= end; i++ {
					now += int64(tc.stepMS * 1e6)
					for r := range tc.ranks {
						st := stepFact(r, int64(i), now, tc.stepMS, tc.wait(r, i), tc.idle > 0)
						if tc.idle > 0 {
							st.Phases[detector.PhaseIdle] = tc.idle * tc.stepMS
						}
						d.ObserveStep(st)
					}
				}
				now = simStart + int64(sec)*int64(time.Second)
				d.ObserveTraps(now, Traps{Total: tc.traps, Critical: tc.critical})
				p = d.Plan(now)
			}
			o := p.Overhead
			if math.Abs(o.Uprobes-tc.wantSpend) > 0.03*tc.wantSpend+1e-5 {
				t.Fatalf("uprobe spend %.6f, want %.6f (hidden %.6f)", o.Uprobes, tc.wantSpend, o.UprobesHidden)
			}
			if math.Abs(o.Uprobes+o.UprobesHidden-tc.traps*c) > 0.03*tc.traps*c {
				t.Fatalf("charged %.6f + hidden %.6f, want all %.6f of the traps", o.Uprobes, o.UprobesHidden, tc.traps*c)
			}
			if want := max(0, cfg.Budget*(1-cfg.EscalationReserve)-tc.wantSpend-cfg.LibraryCost) / cfg.PriorCost; math.Abs(p.OnShare-want) > 0.05*want+1e-4 {
				t.Fatalf("share %.4f, want %.4f", p.OnShare, want)
			}
		})
	}
}

// TestDutyBanksNoWaitForABurstOfTraps: a minute of steps without traps
// leaves at most one ring of steps' wait to hide a burst in.
func TestDutyBanksNoWaitForABurstOfTraps(t *testing.T) {
	d := New(DefaultConfig())
	now := simStart
	for i := 0; i < 60*12; i++ {
		now += int64(82 * time.Millisecond)
		d.ObserveStep(stepFact(0, int64(i), now, 82, 30, false))
		if i%12 == 11 {
			d.ObserveTraps(now, Traps{})
		}
	}
	d.ObserveTraps(now, Traps{Total: 1e5})
	o := d.Plan(now).Overhead
	if hidden, most := o.UprobesHidden*o.Training.Seconds(), 0.030*stepWindow; hidden > most*1.0001 {
		t.Fatalf("hidden %.3f s of the burst, at most %.3f s (one ring of 30-ms waits)", hidden, most)
	}
}

// TestDutyChargesNoDeviceTimeWithoutACollector: while no process can
// collect (no injection library, or collection paused) the plan's on-time
// costs the job nothing and the ledger charges none; from the moment one
// can, it does.
func TestDutyChargesNoDeviceTimeWithoutACollector(t *testing.T) {
	d := New(DefaultConfig())
	now, collecting := simStart, false
	run := func(minutes int) {
		for i := 0; i < minutes*60; i++ {
			now += int64(time.Second)
			d.ObserveStep(stepFact(0, now/int64(time.Second), now, 1000, 0, false))
			d.SetCollecting(now, collecting)
			d.Plan(now)
		}
	}
	run(10)
	if o := d.Plan(now).Overhead; o.Device != 0 {
		t.Fatalf("device spend %g with no collector, want 0", o.Device)
	}
	collecting = true
	run(10)
	if o := d.Plan(now).Overhead; !(o.Device > 0) {
		t.Fatalf("device spend %g with a collector, want > 0 (share %g)", o.Device, d.share)
	}
}

// TestDutyChargesPluginOpsInTotal: the NCCL operations the profiler plugin
// recorded are charged at NCCLPluginCost each, in their own field and in
// Total, all of them (none hidden in the host's wait), and the base share
// is what the budget leaves after them. A process on the plugin path
// whose collective uprobes are detached reports no trap and still spends.
func TestDutyChargesPluginOpsInTotal(t *testing.T) {
	base := DefaultConfig().Budget*(1-DefaultConfig().EscalationReserve) - DefaultConfig().LibraryCost
	for _, tc := range []struct {
		name      string
		cost      time.Duration // NCCLPluginCost; 0: the default
		ops       float64       // plugin operations per second and process
		traps     float64       // uprobe traps per second and process
		wantSpend float64       // plugin spend, fraction of training time
		wantShare float64
	}{
		{"no plugin operations: as before", 0, 0, 100, 0, (base - 100*6e-6) / 0.03},
		{"uprobes detached, 500 plugin ops/s at the default 1 us", 0, 500, 0, 500e-6, (base - 500e-6) / 0.03},
		{"uprobes detached, 1000 plugin ops/s at 0.5 us", 500 * time.Nanosecond, 1000, 0, 500e-6, (base - 500e-6) / 0.03},
		{"plugin ops and traps add up", 0, 500, 100, 500e-6, (base - 500e-6 - 100*6e-6) / 0.03},
		{"plugin ops beyond the budget leave no share", 0, 3000, 0, 3000e-6, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			if tc.cost > 0 {
				cfg.NCCLPluginCost = tc.cost
			}
			d := New(cfg)
			var p Plan
			// A synchronisation's wait of 30 % of the step: it hides
			// traps, never the plugin's operations.
			for i := int64(0); i <= 120; i++ {
				now := simStart + i*int64(time.Second)
				d.ObserveStep(stepFact(0, i, now, 1000, 300, false))
				if i > 0 { // the ledger starts at the first plan
					d.ObserveTraps(now, Traps{Total: tc.traps, Critical: tc.traps})
					d.ObservePluginOps(now, tc.ops)
				}
				p = d.Plan(now)
			}
			o := p.Overhead
			if math.Abs(o.NCCLPlugin-tc.wantSpend) > 1e-9 {
				t.Fatalf("plugin spend %g, want %g (overhead %+v)", o.NCCLPlugin, tc.wantSpend, o)
			}
			if sum := o.Device + o.Uprobes + o.NCCLPlugin + o.Library; math.Abs(o.Total-sum) > 1e-12 || o.Total < tc.wantSpend {
				t.Fatalf("total %g, want %g with the plugin's %g in it", o.Total, sum, o.NCCLPlugin)
			}
			if math.Abs(p.OnShare-tc.wantShare) > 1e-9 {
				t.Fatalf("share %g, want %g (overhead %+v)", p.OnShare, tc.wantShare, o)
			}
		})
	}
}

// TestDutyFirstCandidateGetsDeviceRecords: at defaults (the agent's 5-s
// window as the period), a 4-rank job of 50-200 ms steps with 3 % step
// jitter gets its first escalation within one window of its first
// candidate, device records in each of the next 3 windows, its collection
// cost measured within 60 s, and spends within the budget over the hour.
// The H200's 4-rank job (103-ms steps) had 57 escalations refused and none
// granted, and no pair measured in 5 minutes.
func TestDutyFirstCandidateGetsDeviceRecords(t *testing.T) {
	const window = 5 * time.Second
	for _, stepMS := range []float64{50, 100, 200} {
		for _, first := range []time.Duration{5 * time.Second, 30 * time.Second} {
			t.Run(fmt.Sprintf("%g ms steps, first candidate %s into the run", stepMS, first), func(t *testing.T) {
				cfg := DefaultConfig()
				cfg.Period = window // the agent's period at defaults: the detector window
				s := newDutySim(cfg, uint64(stepMS)+uint64(first))
				s.baseMS, s.jitter, s.cost = stepMS, 0.03, 0.02
				// Uprobe traps that take 0.06 % of step time, as the H200
				// job's did (its base share was 5 % at the 3 % prior).
				s.traps = func(int64) float64 { return 100 }
				// A candidate window settles at `first`; the detector flags
				// the two windows after it too (the streak it needs), and a
				// candidate window every 5 minutes after that.
				at := simStart + int64(first)
				var grantedAt int64
				s.suspect = func(t int64) bool {
					k := t - at
					return k >= 0 && (k < 3*int64(window) && k%int64(window) == 0 || k%int64(5*time.Minute) == 0)
				}
				s.onSuspect = func(t int64, ok bool) {
					if ok && grantedAt == 0 {
						grantedAt = t
					}
				}
				covered := make([]int, 3) // steps with device records in the 3 windows after the candidate
				s.onStep = func(end int64, gpu bool) {
					if w := (end - at) / int64(window); end >= at && w < 3 && gpu {
						covered[w]++
					}
				}
				s.run(60 * time.Second)
				if grantedAt == 0 || grantedAt-at > int64(window) {
					t.Fatalf("first escalation granted at %s (0: never), candidate at %s, want within %s (overhead %+v)",
						time.Duration(max(grantedAt-simStart, 0)), first, window, s.d.Plan(s.now).Overhead)
				}
				for w, n := range covered {
					if n < 3 {
						t.Fatalf("window %d after the candidate: %d steps with device records, want >= 3 (%v)", w+1, n, covered)
					}
				}
				if e := s.d.Estimate(); !e.Measured {
					t.Fatalf("cost not measured 60 s into the run: %+v, drops %+v", e, s.d.drops)
				}
				s.run(time.Hour - 60*time.Second)
				o := s.d.Plan(s.now).Overhead
				if o.Total > cfg.Budget {
					t.Fatalf("spent %.5f of training time over the horizon, budget %g (%+v)", o.Total, cfg.Budget, o)
				}
				if spent := s.trueDevice/s.train + o.Uprobes + o.Library; spent > cfg.Budget {
					t.Fatalf("true spend %.5f over the hour, budget %g", spent, cfg.Budget)
				}
			})
		}
	}
}

// TestDutyPairDriftIsJudgedAgainstJitter: a pair whose off sides differ is
// dropped as drift only when they differ by more than the tolerance and
// more than PairNoise standard errors of the steps' own jitter. With the
// fixed 2 % tolerance alone, 3 % step jitter dropped about a third of the
// pairs and the H200's 4-rank job measured none in 5 minutes.
func TestDutyPairDriftIsJudgedAgainstJitter(t *testing.T) {
	// Offsets of the off steps, relative: ±jitter alternating.
	for _, tc := range []struct {
		name      string
		jitter    float64 // of the off steps
		shift     float64 // after side against before side
		wantDrift bool
	}{
		{"3 % jitter, sides 3 % apart: noise, kept", 0.03, 0.03, false},
		{"3 % jitter, sides 15 % apart: the job moved", 0.03, 0.15, true},
		{"1 % jitter, sides 10 % apart: the job moved", 0.01, 0.10, true},
		{"no jitter, sides 3 % apart: beyond the tolerance", 0, 0.03, true},
		{"no jitter, sides 1 % apart: within the tolerance", 0, 0.01, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Advance = 0
			d := New(cfg)
			now := simStart
			step := func(ms float64, on bool) {
				now += int64(ms * 1e6)
				d.ObserveStep(stepFact(0, now, now, ms, 0, on))
			}
			off := func(base float64, n int) {
				for i := range n {
					sign := 1.0
					if i%2 == 1 {
						sign = -1
					}
					step(base*(1+sign*tc.jitter), false)
				}
			}
			off(100, 10) // the last one partly collected
			for range 5 {
				step(102, true)
			}
			step(100, false) // partly collected
			off(100*(1+tc.shift), 2*cfg.PairSteps+1)
			if got := d.drops.Drift > 0; got != tc.wantDrift {
				t.Fatalf("dropped as drift %v, want %v (drops %+v, pairs %d)", got, tc.wantDrift, d.drops, len(d.clusters))
			}
			if !tc.wantDrift && len(d.clusters) != 1 {
				t.Fatalf("%d pairs (drops %+v), want the block paired", len(d.clusters), d.drops)
			}
		})
	}
}

// TestDutyEscalationShortenedToWhatTheLedgerPays: an escalation the
// ledger cannot pay for in full is granted for the part it can pay, down to
// MinEscalation; shorter, it is refused with the reason. No base share
// here (MaxShare 0): the allowance is Budget × Advance, the escalation's
// cost the 3 % prior plus the library's allowance.
func TestDutyEscalationShortenedToWhatTheLedgerPays(t *testing.T) {
	for _, tc := range []struct {
		name    string
		advance time.Duration
		want    time.Duration // 0: refused
	}{
		{"the advance pays for all of it", 10 * time.Minute, 15 * time.Second},
		{"100 s of advance pay for 9.9 s", 100 * time.Second, 9934 * time.Millisecond}, // (0.3 s − 10 s × 0.01 %) / 3.01 %
		{"50 s of advance pay for less than a window", 50 * time.Second, 0},
		{"no advance, 10 s of training", 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.MaxShare, cfg.Advance = 0, tc.advance
			d := New(cfg)
			now := simStart
			for i := range 11 {
				d.ObserveStep(stepFact(0, int64(i), now, 1000, 0, false))
				d.Plan(now)
				now += int64(time.Second)
			}
			now -= int64(time.Second)
			ok := d.Suspect(now, now-int64(5*time.Second), now)
			p := d.Plan(now)
			if got := time.Duration(p.EscalatedUntil - now); ok != (tc.want > 0) || ok && (got-tc.want).Abs() > 5*time.Millisecond {
				t.Fatalf("granted %v for %s, want %s (overhead %+v)", ok, got, tc.want, p.Overhead)
			}
			if r := p.Overhead.Refused; !ok && !strings.Contains(r, "less than the 5s an escalation needs") {
				t.Fatalf("refusal reason %q", r)
			}
		})
	}
}
