package detector_test

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/slowrank/slowrank/detector"
)

const sec = int64(time.Second)

// job builds facts window by window: 4 steps per rank per window.
type job struct {
	t        *testing.T
	cfg      detector.Config
	ranks    int
	facts    []detector.Step
	topos    []detector.Topology
	stepSeq  map[int]int64
	skipWins map[int]bool
}

func newJob(t *testing.T, ranks int) *job {
	cfg := detector.DefaultConfig()
	cfg.Lateness = 0
	return &job{t: t, cfg: cfg, ranks: ranks, stepSeq: map[int]int64{}, skipWins: map[int]bool{}}
}

// win adds window w where phases(r) gives rank r's phases (nil: silent) and
// wl(r) its workload.
func (j *job) win(w int, phases func(r int) map[string]float64, wl func(r int) *detector.Workload) *job {
	for k := 0; k < 4; k++ {
		end := int64(w)*5*sec + int64(k+1)*sec
		for r := 0; r < j.ranks; r++ {
			ph := phases(r)
			if ph == nil {
				continue
			}
			var w *detector.Workload
			if wl != nil {
				w = wl(r)
			}
			j.stepSeq[r]++
			j.facts = append(j.facts, detector.Step{
				Kind: detector.KindStep, Job: "j", Rank: r, Step: j.stepSeq[r],
				StartNS: end - sec/2, EndNS: end, Phases: ph, GPU: true, Workload: w,
			})
		}
	}
	return j
}

// run feeds everything (origin 0) and returns all verdicts after Flush.
func (j *job) run() ([]detector.Verdict, detector.Summary) {
	j.t.Helper()
	d, err := detector.New(j.cfg)
	if err != nil {
		j.t.Fatal(err)
	}
	d.SetOrigin("j", 0)
	for _, t := range j.topos {
		if err := d.AddTopology(t); err != nil {
			j.t.Fatal(err)
		}
	}
	var out []detector.Verdict
	for _, f := range j.facts {
		vs, err := d.AddStep(f)
		if err != nil {
			j.t.Fatal(err)
		}
		out = append(out, vs...)
	}
	out = append(out, d.Flush()...)
	return out, d.Summaries()[0]
}

// slowOn returns phases where rank slow has compute=slowMS and others 100 ms.
func slowOn(slow int, slowMS float64) func(int) map[string]float64 {
	return func(r int) map[string]float64 {
		c := 100.0
		if r == slow {
			c = slowMS
		}
		return map[string]float64{"compute": c, "host": 20}
	}
}

// states lists "w<window>:<state>" for (rank, phase).
func states(vs []detector.Verdict, rank int, phase string) []string {
	var s []string
	for _, v := range vs {
		if v.Rank == rank && v.Phase == phase {
			s = append(s, fmt.Sprintf("w%d:%s", v.Window, v.State))
		}
	}
	return s
}

func TestStateMachine(t *testing.T) {
	slow, ok := slowOn(3, 110), slowOn(3, 100)
	noCompute := func(r int) map[string]float64 {
		if r == 3 {
			return map[string]float64{"host": 20}
		}
		return map[string]float64{"compute": 100, "host": 20}
	}
	tests := []struct {
		name    string
		windows []func(int) map[string]float64 // nil entry: a gap window
		want    []string
	}{
		{"third consecutive slow window alerts", []func(int) map[string]float64{slow, slow, slow},
			[]string{"w0:candidate", "w1:candidate", "w2:straggler"}},
		{"uncertain window breaks a streak", []func(int) map[string]float64{slow, slow, noCompute, slow, slow, slow},
			[]string{"w0:candidate", "w1:candidate", "w2:uncertain", "w3:candidate", "w4:candidate", "w5:straggler"}},
		{"a gap longer than --carry-windows breaks a streak", []func(int) map[string]float64{slow, slow, nil, nil, nil, nil, slow, slow},
			[]string{"w0:candidate", "w1:candidate", "w6:candidate", "w7:candidate"}},
		{"a shorter gap keeps a streak without lengthening it", []func(int) map[string]float64{slow, slow, nil, nil, slow},
			[]string{"w0:candidate", "w1:candidate", "w4:straggler"}},
		{"uncertain keeps an alert", []func(int) map[string]float64{slow, slow, slow, noCompute, slow},
			[]string{"w0:candidate", "w1:candidate", "w2:straggler", "w3:uncertain", "w4:straggler"}},
		{"gap keeps an alert", []func(int) map[string]float64{slow, slow, slow, nil, nil, slow},
			[]string{"w0:candidate", "w1:candidate", "w2:straggler", "w5:straggler"}},
		{"valid evidence recovers", []func(int) map[string]float64{slow, slow, slow, ok, ok},
			[]string{"w0:candidate", "w1:candidate", "w2:straggler", "w3:recovered"}},
		{"a candidate that turns ok is silent", []func(int) map[string]float64{slow, ok, slow},
			[]string{"w0:candidate", "w2:candidate"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			j := newJob(t, 4)
			for w, ph := range tc.windows {
				if ph != nil {
					j.win(w, ph, nil)
				}
			}
			vs, _ := j.run()
			if got := states(vs, 3, "compute"); !slices.Equal(got, tc.want) {
				t.Errorf("states = %v, want %v", got, tc.want)
			}
			for r := 0; r < 3; r++ {
				if got := states(vs, r, "compute"); len(got) != 0 {
					t.Errorf("healthy rank %d got verdicts %v", r, got)
				}
			}
		})
	}
}

func TestUncertainAlertKeepsAlertActive(t *testing.T) {
	j := newJob(t, 4)
	slow := slowOn(3, 110)
	j.win(0, slow, nil).win(1, slow, nil).win(2, slow, nil)
	j.win(3, func(r int) map[string]float64 {
		if r == 3 {
			return map[string]float64{"host": 20}
		}
		return map[string]float64{"compute": 100, "host": 20}
	}, nil)
	vs, sum := j.run()
	last := vs[len(vs)-1]
	if last.State != "uncertain" || !last.AlertActive || !strings.Contains(last.Reason, "not recovery") {
		t.Errorf("last verdict = %+v, want uncertain with alert_active", last)
	}
	if !slices.Equal(sum.Stragglers, []int{3}) {
		t.Errorf("stragglers = %v, want [3]", sum.Stragglers)
	}
}

func TestFloorAndThreshold(t *testing.T) {
	tests := []struct {
		name      string
		slow, ref float64
		alert     bool
	}{
		{"sub-floor relative deviation never alerts", 1.9, 1.0, false},
		{"above floor but below threshold", 104, 100, false},
		{"above floor and at threshold", 105.01, 100, true},
		{"large absolute, small relative", 1040, 1000, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			j := newJob(t, 4)
			ph := func(r int) map[string]float64 {
				if r == 3 {
					return map[string]float64{"compute": tc.slow}
				}
				return map[string]float64{"compute": tc.ref}
			}
			for w := 0; w < 4; w++ {
				j.win(w, ph, nil)
			}
			_, sum := j.run()
			if got := len(sum.Stragglers) > 0; got != tc.alert {
				t.Errorf("alert = %v, want %v (stragglers %v)", got, tc.alert, sum.Stragglers)
			}
		})
	}
}

func TestPhaseThresholdOverridesThreshold(t *testing.T) {
	// Rank 3 is 10 % slower in both phases; host gets its own 15 % threshold.
	ph := func(r int) map[string]float64 {
		if r == 3 {
			return map[string]float64{"compute": 110, "host": 22}
		}
		return map[string]float64{"compute": 100, "host": 20}
	}
	tests := []struct {
		name      string
		overrides map[string]float64
		want      []string // phases alerted on rank 3
	}{
		{"no override: both phases", nil, []string{"compute", "host"}},
		{"host 15 %: compute only", map[string]float64{"host": 0.15}, []string{"compute"}},
		{"host 9 %: both", map[string]float64{"host": 0.09}, []string{"compute", "host"}},
		{"compute 20 %, host 15 %: none", map[string]float64{"compute": 0.2, "host": 0.15}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			j := newJob(t, 4)
			j.cfg.Exposure = false // the seed's rule: these facts carry no exposure evidence
			j.cfg.PhaseThresholds = tc.overrides
			for w := 0; w < 4; w++ {
				j.win(w, ph, nil)
			}
			vs, _ := j.run()
			var got []string
			for _, v := range vs {
				if v.Rank == 3 && v.State == "straggler" && !slices.Contains(got, v.Phase) {
					got = append(got, v.Phase)
				}
			}
			slices.Sort(got)
			if !slices.Equal(got, tc.want) {
				t.Errorf("alerted phases %v, want %v", got, tc.want)
			}
		})
	}
}

func TestWorkloadComparability(t *testing.T) {
	fp := func(slowFP string) func(int) *detector.Workload {
		return func(r int) *detector.Workload {
			if r == 3 {
				return &detector.Workload{FP: slowFP}
			}
			return &detector.Workload{FP: "a"}
		}
	}
	tokens := func(slowTokens int64) func(int) *detector.Workload {
		return func(r int) *detector.Workload {
			if r == 3 {
				return &detector.Workload{Tokens: slowTokens}
			}
			return &detector.Workload{Tokens: 8192}
		}
	}
	tests := []struct {
		name         string
		wl           func(int) *detector.Workload
		wantLast     string
		wantDegraded bool
		reason       string
	}{
		{"equal fingerprints compare", fp("a"), "straggler", false, "fastest of 3"},
		{"unequal fingerprints do not", fp("b"), "uncertain", false, "workload present but 0 comparable"},
		{"a lone kernel mix is named", fp("b"), "uncertain", false, "differs from the one all 3 peers share (a)"},
		{"tokens within tolerance compare", tokens(8300), "straggler", false, "fastest of 3"},
		{"tokens outside tolerance do not", tokens(9000), "uncertain", false, "workload present"},
		{"missing workload degrades and may alert", func(int) *detector.Workload { return nil }, "straggler", true, "compared with the cohort by time only"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			j := newJob(t, 4)
			for w := 0; w < 3; w++ {
				j.win(w, slowOn(3, 120), tc.wl)
			}
			vs, _ := j.run()
			var last detector.Verdict
			for _, v := range vs {
				if v.Rank == 3 && v.Phase == "compute" {
					last = v
				}
			}
			if last.State != tc.wantLast || last.WorkloadEvidenceDegraded != tc.wantDegraded || !strings.Contains(last.Reason, tc.reason) {
				t.Errorf("got state %q degraded %v reason %q; want %q %v containing %q",
					last.State, last.WorkloadEvidenceDegraded, last.Reason, tc.wantLast, tc.wantDegraded, tc.reason)
			}
		})
	}
}

func TestMismatchNamedOnlyWhenPeersAgree(t *testing.T) {
	tests := []struct {
		name  string
		ranks int
		fp    func(r int) string
	}{
		{"the peers disagree too", 4, func(r int) string { return fmt.Sprintf("p%d", r) }},
		{"two ranks: either could be the odd one", 2, func(r int) string { return fmt.Sprintf("p%d", r) }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			j := newJob(t, tc.ranks)
			j.win(0, slowOn(tc.ranks-1, 120), func(r int) *detector.Workload { return &detector.Workload{FP: tc.fp(r)} })
			vs, _ := j.run()
			if len(vs) == 0 {
				t.Fatal("no verdicts")
			}
			for _, v := range vs {
				if v.State != "uncertain" || strings.Contains(v.Reason, "differs") {
					t.Errorf("rank %d %s: %s %q; want uncertain without a mismatch claim", v.Rank, v.Phase, v.State, v.Reason)
				}
			}
		})
	}
}

func TestNoComparableReferenceIsUncertain(t *testing.T) {
	j := newJob(t, 1)
	j.win(0, func(int) map[string]float64 { return map[string]float64{"compute": 100} }, nil)
	vs, _ := j.run()
	if len(vs) != 1 || vs[0].State != "uncertain" || !strings.Contains(vs[0].Reason, "only 0 other members") {
		t.Fatalf("verdicts = %+v", vs)
	}
	j = newJob(t, 4)
	j.cfg.MinReferences = 4
	j.win(0, slowOn(3, 120), nil)
	vs, _ = j.run()
	if got := states(vs, 0, "compute"); !slices.Equal(got, []string{"w0:uncertain"}) {
		t.Errorf("min-references 4 with 3 peers: %v", got)
	}
}

func TestPhaseNotMeasuredByCohortIsNotEvaluated(t *testing.T) {
	j := newJob(t, 4)
	j.win(0, func(int) map[string]float64 { return map[string]float64{"host": 20} }, nil)
	vs, _ := j.run()
	for _, v := range vs {
		if v.Phase == "compute" {
			t.Fatalf("compute judged although nobody measured it: %+v", v)
		}
	}
}

func TestHints(t *testing.T) {
	j := newJob(t, 4)
	j.cfg.Exposure = false // the seed's rule: these facts carry no exposure evidence
	ph := func(r int) map[string]float64 {
		switch r {
		case 1:
			return map[string]float64{"compute": 100, "host": 40}
		case 3:
			return map[string]float64{"compute": 120, "host": 20}
		}
		return map[string]float64{"compute": 100, "host": 20}
	}
	for w := 0; w < 3; w++ {
		j.win(w, ph, nil)
	}
	vs, _ := j.run()
	want := map[string]string{"3/compute": "gpu_stream_stall", "1/host": "host_only_stall"}
	for _, v := range vs {
		if v.State != "straggler" {
			continue
		}
		k := fmt.Sprintf("%d/%s", v.Rank, v.Phase)
		if h, ok := want[k]; !ok || v.Hint != h {
			t.Errorf("%s: hint %q, want %q", k, v.Hint, want[k])
		}
		delete(want, k)
	}
	if len(want) > 0 {
		t.Errorf("no straggler verdicts for %v", want)
	}
}

func TestTopologyCohorts(t *testing.T) {
	j := newJob(t, 8)
	j.topos = []detector.Topology{{Kind: "topology", Job: "j", Version: 1, Groups: []detector.Group{
		{ID: "dp0", Type: "dp", Ranks: []int{0, 1, 2, 3}},
		{ID: "dp1", Type: "dp", Ranks: []int{4, 5, 6, 7}},
		{ID: "tp0", Type: "tp", Ranks: []int{0, 4}},
	}}}
	// Group dp1 runs 50 % slower work than dp0: only rank 6 is slow within it.
	ph := func(r int) map[string]float64 {
		c := 100.0
		if r >= 4 {
			c = 150
		}
		if r == 6 {
			c = 170
		}
		return map[string]float64{"compute": c}
	}
	for w := 0; w < 3; w++ {
		j.win(w, ph, nil)
	}
	vs, sum := j.run()
	if !slices.Equal(sum.Stragglers, []int{6}) {
		t.Fatalf("stragglers = %v, want [6]", sum.Stragglers)
	}
	for _, v := range vs {
		if v.Rank == 6 && !slices.Equal(v.ComparableRanks, []int{4, 5, 7}) || v.Cohort != "dp1" {
			t.Errorf("rank 6 compared with %v in %q, want [4 5 7] in dp1", v.ComparableRanks, v.Cohort)
		}
	}
}

func TestEviction(t *testing.T) {
	j := newJob(t, 4)
	j.cfg.EvictAfter = 2
	all := slowOn(-1, 0)
	j.win(0, all, nil)
	for w := 1; w < 6; w++ {
		j.win(w, func(r int) map[string]float64 {
			if r == 3 {
				return nil
			}
			return all(r)
		}, nil)
	}
	vs, sum := j.run()
	if got := states(vs, 3, "compute"); !slices.Equal(got, []string{"w1:uncertain", "w2:uncertain", "w3:uncertain"}) {
		t.Errorf("silent rank states = %v", got)
	}
	if sum.Evicted != 1 {
		t.Errorf("evicted = %d, want 1", sum.Evicted)
	}
}

func TestWorstRankNeverMaskedByLesserStates(t *testing.T) {
	j := newJob(t, 6)
	ph := func(w int) func(int) map[string]float64 {
		return func(r int) map[string]float64 {
			switch {
			case r == 1:
				return map[string]float64{"compute": 110}
			case r == 2 && w >= 1:
				return map[string]float64{"compute": 190} // candidate with a larger deviation
			case r == 4 && w == 2:
				return map[string]float64{"host": 1} // uncertain for compute
			}
			return map[string]float64{"compute": 100}
		}
	}
	for w := 0; w < 3; w++ {
		j.win(w, ph(w), nil)
	}
	_, sum := j.run()
	if sum.WorstRank == nil || *sum.WorstRank != 1 || sum.WorstState != "straggler" {
		t.Fatalf("worst = %v (%s), want rank 1 straggler", sum.WorstRank, sum.WorstState)
	}
}

func TestFinalWindowSettledOnFlushAndAdvance(t *testing.T) {
	cfg := detector.DefaultConfig()
	cfg.Consecutive = 1
	cfg.Lateness = time.Second
	d, _ := detector.New(cfg)
	d.SetOrigin("j", 0)
	for r := 0; r < 4; r++ {
		c := 100.0
		if r == 3 {
			c = 150
		}
		vs, _ := d.AddStep(detector.Step{Job: "j", Rank: r, Step: 1, EndNS: 2 * sec, Phases: map[string]float64{"compute": c}})
		if len(vs) != 0 {
			t.Fatalf("window settled before its end: %+v", vs)
		}
	}
	if vs := d.Advance(5*sec + sec - 1); len(vs) != 0 {
		t.Fatalf("settled inside the lateness allowance: %+v", vs)
	}
	if vs := d.Advance(6 * sec); len(vs) != 1 || vs[0].Rank != 3 || vs[0].State != "straggler" {
		t.Fatalf("Advance past lateness: %+v", vs)
	}
	d2, _ := detector.New(cfg)
	if _, err := d2.AddStep(detector.Step{Job: "j", Rank: 0, Step: 1, EndNS: 2 * sec, Phases: map[string]float64{"compute": 100}}); err != nil {
		t.Fatal(err)
	}
	if _, err := d2.AddStep(detector.Step{Job: "j", Rank: 1, Step: 1, EndNS: 2 * sec, Phases: map[string]float64{"compute": 150}}); err != nil {
		t.Fatal(err)
	}
	if vs := d2.Flush(); len(vs) != 1 || vs[0].Rank != 1 {
		t.Fatalf("Flush did not settle the last window: %+v", vs)
	}
}

func TestLateAndDuplicateFactsAreCounted(t *testing.T) {
	cfg := detector.DefaultConfig()
	cfg.Lateness = 0
	d, _ := detector.New(cfg)
	d.SetOrigin("j", 0)
	add := func(rank int, step int64, end int64) {
		if _, err := d.AddStep(detector.Step{Job: "j", Rank: rank, Step: step, EndNS: end, Phases: map[string]float64{"compute": 1}}); err != nil {
			t.Fatal(err)
		}
	}
	add(0, 1, 1*sec)
	add(0, 1, 1*sec) // duplicate
	add(0, 2, 7*sec) // settles window 0
	add(1, 1, 2*sec) // late
	s := d.Summaries()[0]
	if s.Duplicates != 1 || s.Late != 1 || s.Facts != 4 {
		t.Errorf("summary = %+v, want 1 duplicate, 1 late, 4 facts", s)
	}
}

// A streaming caller sets no origin: the first fact received sets it, and
// facts of other ranks that ended a little earlier arrive after it. Until a
// window settles they are judged in windows on the same grid, not dropped.
func TestFactsBeforeTheFirstReceivedAreNotLate(t *testing.T) {
	cfg := detector.DefaultConfig()
	cfg.Lateness = time.Second
	d, _ := detector.New(cfg)
	var vs []detector.Verdict
	add := func(rank int, step int64, end int64) {
		v, err := d.AddStep(detector.Step{Job: "j", Rank: rank, Step: step, EndNS: end, Phases: map[string]float64{"compute": 1}})
		if err != nil {
			t.Fatal(err)
		}
		vs = append(vs, v...)
	}
	add(0, 9, 6*sec)   // the origin: windows [6 s, 11 s), ...
	add(1, 1, 2*sec)   // 4 s earlier: window [1 s, 6 s)
	add(1, 9, 6*sec)   // same window as rank 0's first
	add(0, 20, 13*sec) // settles [1 s, 6 s): rank 0 sent nothing there
	add(1, 0, sec)     // a window has settled: late now
	if s := d.Summaries()[0]; s.Late != 1 || s.Facts != 5 {
		t.Errorf("summary = %+v, want 1 late of 5 facts", s)
	}
	var got []string
	for _, v := range vs {
		got = append(got, fmt.Sprintf("r%d [%d s, %d s) %s", v.Rank, v.WindowStartNS/sec, v.WindowEndNS/sec, v.State))
	}
	if want := "[r0 [1 s, 6 s) uncertain r1 [1 s, 6 s) uncertain]"; fmt.Sprint(got) != want {
		t.Errorf("verdicts %v, want %s", got, want)
	}
}

// At a job's start one rank's steps can reach the detector seconds ahead of
// the others'. Its first windows wait one window more for the ranks its
// topology names that have sent nothing, so they are judged with them; a
// rank that never reports delays only those windows.
func TestFirstWindowsWaitForRanksNotYetHeard(t *testing.T) {
	for _, tc := range []struct {
		name    string
		skewSec int64 // how far rank 0's steps run ahead of rank 1's first
		want    string
	}{
		{"the others arrive within a window", 9, "[w0 r0 ok w0 r1 ok w1 r0 ok w1 r1 ok]"},
		{"the others arrive too late", 20, "[w0 r0 uncertain w0 r1 uncertain w1 r0 uncertain w1 r1 uncertain]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := detector.DefaultConfig()
			cfg.EmitOK = true
			cfg.MinReferences = 1
			d, _ := detector.New(cfg)
			if err := d.AddTopology(detector.Topology{Job: "j", Version: 1, Ranks: []detector.RankInfo{{Rank: 0}, {Rank: 1}, {Rank: 2}}}); err != nil {
				t.Fatal(err)
			}
			var vs []detector.Verdict
			add := func(rank int, step int64, end int64) {
				v, err := d.AddStep(detector.Step{Job: "j", Rank: rank, Step: step, EndNS: end, Phases: map[string]float64{"compute": 1}})
				if err != nil {
					t.Fatal(err)
				}
				vs = append(vs, v...)
			}
			for k := int64(0); k <= tc.skewSec; k++ { // rank 0 alone, a step a second
				add(0, k, k*sec+sec/2)
			}
			for k := int64(0); k < 10; k++ { // rank 1 from its first step
				add(1, k, k*sec+sec/2)
			}
			vs = append(vs, d.Flush()...)
			var got []string
			for _, v := range vs {
				if v.Window < 2 && v.Rank < 2 {
					got = append(got, fmt.Sprintf("w%d r%d %s", v.Window, v.Rank, v.State))
				}
			}
			if fmt.Sprint(got) != tc.want {
				t.Errorf("verdicts %v, want %s", got, tc.want)
			}
		})
	}
}

func TestInvalidFactsAreErrors(t *testing.T) {
	d, _ := detector.New(detector.DefaultConfig())
	bad := []detector.Step{
		{Rank: 0, EndNS: 1},
		{Job: "j", Rank: -1, EndNS: 1},
		{Job: "j", StartNS: 5, EndNS: 1},
		{Job: "j", EndNS: 1, Phases: map[string]float64{"compute": -1}},
		{Job: "j", EndNS: 1, Workload: &detector.Workload{Tokens: -1}},
		{Job: "j", EndNS: 1, Workload: &detector.Workload{Tokens: detector.MaxTokens + 1}}, // medians of two would overflow near 2^63
	}
	for _, s := range bad {
		if _, err := d.AddStep(s); err == nil {
			t.Errorf("AddStep(%+v) accepted", s)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	c := detector.DefaultConfig()
	c.Window, c.Consecutive, c.Phases = 0, 0, []string{"compute", "compute"}
	c.PhaseThresholds = map[string]float64{"attention": 0.1, "compute": 0}
	err := c.Validate()
	for _, want := range []string{"window", "consecutive", "distinct", `"attention", which is not an evaluated phase`, `threshold of phase "compute"`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v, want mention of %q", err, want)
		}
	}
	// A threshold is a fraction: 5 read as 500 % once, silently.
	for _, th := range []float64{5, 1, 0, -0.1} {
		c := detector.DefaultConfig()
		c.Threshold = th
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "fraction in (0, 1)") {
			t.Errorf("threshold %g: Validate() = %v, want a refusal", th, err)
		}
	}
}

func TestForgetJobAndTopologyPruning(t *testing.T) {
	cfg := detector.DefaultConfig()
	cfg.Lateness, cfg.MaxJobs = 0, 1
	d, _ := detector.New(cfg)
	for v := 1; v <= 50; v++ {
		if err := d.AddTopology(detector.Topology{Job: "a", Version: v, Groups: []detector.Group{{ID: "dp", Type: "dp", Ranks: []int{0, 1}}}}); err != nil {
			t.Fatal(err)
		}
		if _, err := d.AddStep(detector.Step{Job: "a", Topo: v, Rank: 0, Step: int64(v), EndNS: int64(v) * 6 * sec, Phases: map[string]float64{"compute": 1}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := d.AddStep(detector.Step{Job: "b", Rank: 0, Step: 1, EndNS: 1, Phases: map[string]float64{}}); err != nil {
		t.Fatal(err)
	}
	if n := len(d.Summaries()); n != 1 {
		t.Fatalf("MaxJobs 1: %d jobs tracked", n)
	}
	d.ForgetJob("a")
	if n := len(d.Summaries()); n != 0 {
		t.Fatalf("after ForgetJob: %d jobs", n)
	}
	if _, err := d.AddStep(detector.Step{Job: "b", Rank: 0, Step: 1, EndNS: 1, Phases: map[string]float64{}}); err != nil {
		t.Fatal(err)
	}
	if s := d.Summaries(); len(s) != 1 || s[0].Job != "b" {
		t.Fatalf("the freed slot was not reused: %+v", s)
	}
}

// Topologies name ranks that may never send a fact, and any local user can
// start processes that claim jobs: the ranks with state over all jobs are
// bounded, the refusals counted, and a forgotten job's ranks free the budget.
func TestRankStateIsBoundedOverAllJobs(t *testing.T) {
	cfg := detector.DefaultConfig()
	cfg.MaxTotalRanks = 100
	d, _ := detector.New(cfg)
	world := func(job string, n int) detector.Topology {
		g := detector.Group{ID: "world", Type: "world"}
		for r := range n {
			g.Ranks = append(g.Ranks, r)
		}
		return detector.Topology{Job: job, Version: 1, Groups: []detector.Group{g}}
	}
	for _, job := range []string{"a", "b", "c"} {
		if err := d.AddTopology(world(job, 40)); err != nil {
			t.Fatal(err)
		}
	}
	rejected := map[string]int64{}
	for _, s := range d.Summaries() {
		rejected[s.Job] = s.RejectedRanks
	}
	if rejected["a"] != 0 || rejected["b"] != 0 || rejected["c"] != 20 {
		t.Fatalf("rejected ranks %v, want a:0 b:0 c:20 (100 over all jobs)", rejected)
	}
	d.ForgetJob("a")
	if err := d.AddTopology(world("d", 40)); err != nil {
		t.Fatal(err)
	}
	for _, s := range d.Summaries() {
		if s.Job == "d" && s.RejectedRanks != 0 {
			t.Fatalf("job d: %d ranks rejected after job a's 40 were freed", s.RejectedRanks)
		}
	}
}

func TestTimesNearTheInt64LimitsAreInvalid(t *testing.T) {
	for _, tc := range []struct {
		name       string
		start, end int64
	}{
		{"end near 2^63", 0, math.MaxInt64 - 1},
		{"end at 2^62", 0, detector.MaxTimeNS},
		{"start near -2^63", math.MinInt64 + 1, 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := detector.New(detector.DefaultConfig())
			if err != nil {
				t.Fatal(err)
			}
			s := detector.Step{Kind: detector.KindStep, Job: "j", Rank: 0, StartNS: tc.start, EndNS: tc.end, Phases: map[string]float64{detector.PhaseStep: 1}}
			if _, err := d.AddStep(s); !errors.Is(err, detector.ErrInvalidFact) {
				t.Fatalf("AddStep(%d, %d) = %v, want detector.ErrInvalidFact", tc.start, tc.end, err)
			}
		})
	}
}
