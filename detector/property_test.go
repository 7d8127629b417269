package detector_test

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/slowrank/slowrank/detector"
	"github.com/slowrank/slowrank/detector/sim"
)

// simulated returns the steps of a 16-rank job with a compute straggler, a
// host straggler that recovers, and a gap.
func simulated(t testing.TB, seed uint64) []detector.Step {
	c := sim.Default()
	c.Ranks, c.Seed, c.Duration = 16, seed, 90*time.Second
	c.Slowdowns = []sim.Slowdown{
		{Rank: 5, Phase: "compute", From: 20 * time.Second, Factor: 1.2},
		{Rank: 11, Phase: "host", From: 10 * time.Second, To: 50 * time.Second, AddMS: 20},
	}
	c.Gaps = []sim.Gap{{From: 60 * time.Second, To: 66 * time.Second, Ranks: []int{2}}}
	var steps []detector.Step
	if err := sim.Generate(c, func(v any) error {
		if s, ok := v.(detector.Step); ok {
			steps = append(steps, s)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return steps
}

func judge(t testing.TB, cfg detector.Config, steps []detector.Step) []detector.Verdict {
	d, err := detector.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var t0 int64 = math.MaxInt64
	for _, s := range steps {
		t0 = min(t0, s.EndNS)
	}
	d.SetOrigin(steps[0].Job, t0)
	var out []detector.Verdict
	for _, s := range steps {
		vs, err := d.AddStep(s)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, vs...)
	}
	return append(out, d.Flush()...)
}

// key is a verdict's identity and judgement, without the float details.
func keys(vs []detector.Verdict, rename func(int) int) []string {
	var out []string
	for _, v := range vs {
		out = append(out, fmt.Sprintf("w%d r%d %s %s ref%d", v.Window, rename(v.Rank), v.Phase, v.State, rename(v.ReferenceRank)))
	}
	sort.Strings(out)
	return out
}

func id(r int) int { return r }

func TestPropertyStragglersFound(t *testing.T) {
	vs := judge(t, detector.DefaultConfig(), simulated(t, 1))
	stragglers := map[string]bool{}
	for _, v := range vs {
		if v.State == "straggler" {
			stragglers[fmt.Sprintf("%d/%s", v.Rank, v.Phase)] = true
		}
	}
	if !stragglers["5/compute"] || !stragglers["11/host"] || len(stragglers) != 2 {
		t.Fatalf("stragglers = %v, want exactly 5/compute and 11/host", stragglers)
	}
}

func TestPropertyRenamingRanksRenamesVerdicts(t *testing.T) {
	steps := simulated(t, 2)
	perm := rand.New(rand.NewPCG(7, 7)).Perm(16)
	renamed := slices.Clone(steps)
	for i := range renamed {
		renamed[i].Rank = perm[renamed[i].Rank]
	}
	cfg := detector.DefaultConfig()
	a := keys(judge(t, cfg, steps), func(r int) int {
		if r < 0 {
			return r
		}
		return perm[r]
	})
	b := keys(judge(t, cfg, renamed), id)
	if !slices.Equal(a, b) {
		t.Fatalf("renamed verdicts differ:\n%v\n%v", a, b)
	}
}

func TestPropertyReorderWithinWindowChangesNothing(t *testing.T) {
	steps := simulated(t, 3)
	cfg := detector.DefaultConfig()
	cfg.Lateness = time.Hour // nothing settles before Flush
	base, _ := json.Marshal(judge(t, cfg, steps))
	rng := rand.New(rand.NewPCG(9, 9))
	for trial := 0; trial < 5; trial++ {
		shuffled := slices.Clone(steps)
		rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		// The first fact fixes nothing: the origin is set from the minimum.
		got, _ := json.Marshal(judge(t, cfg, shuffled))
		if string(got) != string(base) {
			t.Fatalf("trial %d: reordered facts changed the verdicts", trial)
		}
	}
}

func TestPropertyScalingAllTimesLeavesVerdictsUnchanged(t *testing.T) {
	steps := simulated(t, 4)
	cfg := detector.DefaultConfig()
	base := keys(judge(t, cfg, steps), id)
	for _, k := range []int64{2, 10} {
		scaled := slices.Clone(steps)
		for i := range scaled {
			s := &scaled[i]
			s.StartNS, s.EndNS = s.StartNS*k, s.EndNS*k
			ph := map[string]float64{}
			for p, v := range s.Phases {
				ph[p] = v * float64(k)
			}
			s.Phases = ph
		}
		sc := cfg
		sc.Window, sc.Floor, sc.Lateness = cfg.Window*time.Duration(k), cfg.Floor*time.Duration(k), cfg.Lateness*time.Duration(k)
		if got := keys(judge(t, sc, scaled), id); !slices.Equal(got, base) {
			t.Fatalf("scaling by %d changed verdicts:\n%v\n%v", k, got, base)
		}
	}
}

func TestPropertyHealthyJobRaisesNoAlert(t *testing.T) {
	for seed := uint64(1); seed <= 10; seed++ {
		c := sim.Default()
		c.Ranks, c.Seed, c.Duration = 32, seed, 120*time.Second
		var steps []detector.Step
		if err := sim.Generate(c, func(v any) error {
			steps = append(steps, v.(detector.Step))
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		for _, v := range judge(t, detector.DefaultConfig(), steps) {
			if v.State == "straggler" {
				t.Fatalf("seed %d: false alert %+v", seed, v)
			}
		}
	}
}
