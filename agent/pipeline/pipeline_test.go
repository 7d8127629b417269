package pipeline

import (
	"fmt"
	"maps"
	"slices"
	"testing"

	"github.com/slowrank/slowrank/correlate"
	"github.com/slowrank/slowrank/detector"
)

type recordSink struct {
	steps    int
	windows  int
	verdicts []detector.Verdict
}

func (r *recordSink) Topology(detector.Topology) {}
func (r *recordSink) Step(detector.Step, int64)  { r.steps++ }
func (r *recordSink) Settled(_ detector.SettledWindow, vs []detector.Verdict) {
	r.windows++
	r.verdicts = append(r.verdicts, vs...)
}

func TestSettleAttachesGPUEvidenceAndHandsEveryWindow(t *testing.T) {
	cfg := detector.DefaultConfig()
	cfg.Lateness = 0
	det, _ := detector.New(cfg)
	sink := &recordSink{}
	p := New(Config{Correlator: correlate.New(correlate.Config{}), Detector: det, Sinks: []Sink{sink},
		Evidence: func(job string, rank int, start, end int64) *detector.GPUEvidence {
			return &detector.GPUEvidence{Index: rank, TempMaxC: 90}
		}})
	var steps []detector.Step
	for k := int64(0); k < 40; k++ {
		for r := 0; r < 4; r++ {
			c := 100.0
			if r == 2 {
				c = 130
			}
			steps = append(steps, detector.Step{Kind: "step", Job: "j", Rank: r, Step: k, EndNS: (k + 1) * 500_000_000,
				Phases: map[string]float64{"compute": c, "host": 10}})
		}
	}
	p.deliver(steps, nil)
	p.Flush(0)
	if sink.steps != 160 || sink.windows < 4 {
		t.Fatalf("sink saw %d steps and %d windows", sink.steps, sink.windows)
	}
	found := false
	for _, v := range sink.verdicts {
		if v.Rank == 2 && v.State == detector.StateStraggler {
			found = true
			if v.GPU == nil || v.GPU.Index != 2 || v.GPU.TempMaxC != 90 {
				t.Errorf("verdict without the rank's GPU evidence: %+v", v.GPU)
			}
		}
	}
	if !found {
		t.Fatal("no straggler verdict for rank 2")
	}
}

// fakeDuty records what the pipeline tells the duty-cycle controller.
type fakeDuty struct {
	observed  []int // ranks of the steps observed
	suspected int
	forgot    []int
}

func (d *fakeDuty) ObserveStep(st detector.Step) { d.observed = append(d.observed, st.Rank) }
func (d *fakeDuty) Suspect(_, _, _ int64) bool   { d.suspected++; return true }
func (d *fakeDuty) Forget(rank int)              { d.forgot = append(d.forgot, rank) }

// The correlate_* and detector_* metrics exist from the start, under the
// names the agent has always exported.
func TestCountersKeepTheirNamesBeforeAnyRecord(t *testing.T) {
	det, _ := detector.New(detector.DefaultConfig())
	p := New(Config{Correlator: correlate.New(correlate.Config{}), Detector: det})
	want := []string{
		"correlate_arrival_misaligned", "correlate_arrival_realigned", "correlate_arrival_timeouts", "correlate_burst_steps", "correlate_degraded_steps", "correlate_device_arrival_timeouts",
		"correlate_dropped_device", "correlate_dropped_host", "correlate_duplicate", "correlate_evicted",
		"correlate_implausible_sizes", "correlate_init_calls", "correlate_invalid_steps", "correlate_irregular_calls",
		"correlate_kernel_records", "correlate_kernels_unmatched", "correlate_late",
		"correlate_norank_steps", "correlate_relocks", "correlate_reordered", "correlate_retracted_steps",
		"correlate_unassigned", "detector_duplicates", "detector_evicted", "detector_late",
		"detector_late_after_swap", "detector_rejected_ranks",
	}
	got := p.Counters()
	if len(got) != len(want) {
		t.Errorf("%d counters, want %d: %v", len(got), len(want), got)
	}
	for _, k := range want {
		if v, ok := got[k]; !ok || v != 0 {
			t.Errorf("%s = %d, present %v; want 0", k, v, ok)
		}
	}
}

func TestDutyHearsOfCoveredStepsSuspicionAndExits(t *testing.T) {
	tests := []struct {
		name       string
		phases     map[string]float64
		slowRank   int // -1: none
		wantSteps  int
		wantSuspct bool
	}{
		{"steps with a step phase are observed", map[string]float64{"step": 100, "compute": 90}, -1, 40, false},
		{"steps without one are not", map[string]float64{"compute": 90}, -1, 0, false},
		{"a straggler's window is suspected", map[string]float64{"step": 100, "compute": 90}, 1, 40, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := detector.DefaultConfig()
			cfg.Lateness = 0
			det, _ := detector.New(cfg)
			duty := &fakeDuty{}
			p := New(Config{Correlator: correlate.New(correlate.Config{}), Detector: det, Duty: duty})
			var steps []detector.Step
			for k := int64(0); k < 10; k++ {
				for r := 0; r < 4; r++ {
					ph := maps.Clone(tt.phases)
					if r == tt.slowRank {
						ph["compute"] *= 1.5
					}
					steps = append(steps, detector.Step{Kind: "step", Job: "j", Rank: r, Step: k, EndNS: (k + 1) * 500_000_000, Phases: ph})
				}
			}
			p.deliver(steps, nil)
			p.Flush(0)
			if len(duty.observed) != tt.wantSteps {
				t.Errorf("observed %d steps, want %d", len(duty.observed), tt.wantSteps)
			}
			if (duty.suspected > 0) != tt.wantSuspct {
				t.Errorf("suspected %d times, want suspicion %v", duty.suspected, tt.wantSuspct)
			}
			p.Forget(77, 3)
			if !slices.Equal(duty.forgot, []int{3}) {
				t.Errorf("forgot ranks %v, want [3]", duty.forgot)
			}
		})
	}
}

// A plugin-path process's records wait until its exit feeds them; the
// event dump sees each record when it reaches the correlator, then the exit.
func TestForgetFeedsWhatAPluginProcessHeld(t *testing.T) {
	det, _ := detector.New(detector.DefaultConfig())
	var dumped []string
	p := New(Config{Correlator: correlate.New(correlate.Config{}), Detector: det,
		Dump: func(v any) { dumped = append(dumped, fmt.Sprintf("%T", v)) }})
	p.Feed(OtherInput(PluginPath{PID: 5}))
	p.Feed(HostInput(correlate.HostCall{PID: 5, Kind: correlate.HostSyncWait, StartNS: 1, EndNS: 2}))
	p.Feed(HostInput(correlate.HostCall{PID: 6, Kind: correlate.HostSyncWait, StartNS: 1, EndNS: 2}))
	if p.reorder.held() != 1 {
		t.Fatalf("%d held, want pid 5's call", p.reorder.held())
	}
	p.Forget(5, 0)
	want := []string{"pipeline.PluginPath", "correlate.HostCall", "pipeline.forget", "correlate.HostCall"}
	if !slices.Equal(dumped, want) || p.reorder.held() != 0 {
		t.Fatalf("dumped %v, want %v; %d still held", dumped, want, p.reorder.held())
	}
}

func TestSnapshotOrdersRanksAndKeepsTheLastVerdicts(t *testing.T) {
	det, _ := detector.New(detector.DefaultConfig())
	p := New(Config{Correlator: correlate.New(correlate.Config{}), Detector: det})
	for _, k := range []rankKey{{"b", 1}, {"a", 2}, {"b", 0}, {"a", 0}} {
		p.noteStep(detector.Step{Job: k.job, Rank: k.rank, Host: "h"})
	}
	vs := make([]detector.Verdict, recentVerdicts+10)
	for i := range vs {
		vs[i] = detector.Verdict{Job: "a", Rank: 2, Window: int64(i)}
	}
	p.noteSettled([]detector.SettledWindow{{Job: "a"}, {Job: "b"}, {Job: "a", Index: 1}}, vs)
	s := p.Snapshot()
	var order []rankKey
	for _, r := range s.Ranks {
		order = append(order, rankKey{r.Job, r.Rank})
	}
	if want := []rankKey{{"a", 0}, {"a", 2}, {"b", 0}, {"b", 1}}; !slices.Equal(order, want) {
		t.Errorf("ranks %v, want %v", order, want)
	}
	if v := s.Ranks[1].Verdict; v == nil || v.Window != int64(len(vs)-1) || s.Ranks[0].Verdict != nil {
		t.Errorf("rank a/2 verdict %+v, want the latest; a/0 %+v, want none", v, s.Ranks[0].Verdict)
	}
	if len(s.Recent) != recentVerdicts || s.Recent[recentVerdicts-1].Window != int64(len(vs)-1) {
		t.Errorf("%d recent verdicts, want the last %d", len(s.Recent), recentVerdicts)
	}
	if s.Windows != 3 || s.Facts != 4 || s.Verdicts != int64(len(vs)) {
		t.Errorf("windows %d facts %d verdicts %d", s.Windows, s.Facts, s.Verdicts)
	}
}

// A row shows a rank's non-ok verdict while it is current: a later window
// of the job settled without one clears it, but not an active alert.
func TestSnapshotForgetsAVerdictALaterWindowDidNotRepeat(t *testing.T) {
	det, _ := detector.New(detector.DefaultConfig())
	p := New(Config{Correlator: correlate.New(correlate.Config{}), Detector: det})
	for r := range 3 {
		p.noteStep(detector.Step{Job: "a", Rank: r, Host: "h"})
	}
	p.noteStep(detector.Step{Job: "b", Rank: 0, Host: "h"})
	p.noteSettled([]detector.SettledWindow{{Job: "a"}, {Job: "b"}}, []detector.Verdict{
		{Job: "a", Rank: 0, Window: 0, State: detector.StateUncertain},
		{Job: "a", Rank: 1, Window: 0, State: detector.StateStraggler, AlertActive: true},
		{Job: "b", Rank: 0, Window: 0, State: detector.StateUncertain},
	})
	p.noteSettled([]detector.SettledWindow{{Job: "a", Index: 1}}, []detector.Verdict{
		{Job: "a", Rank: 2, Window: 1, State: detector.StateCandidate},
	})
	got := map[rankKey]string{}
	for _, r := range p.Snapshot().Ranks {
		got[rankKey{r.Job, r.Rank}] = "ok"
		if r.Verdict != nil {
			got[rankKey{r.Job, r.Rank}] = r.Verdict.State
		}
	}
	want := map[rankKey]string{{"a", 0}: "ok", {"a", 1}: detector.StateStraggler, {"a", 2}: detector.StateCandidate,
		{"b", 0}: detector.StateUncertain}
	if !maps.Equal(got, want) {
		t.Errorf("rows %v, want %v", got, want)
	}
}
