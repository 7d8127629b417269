package agent

import (
	"log/slog"
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

func TestPipelineAttachesGPUEvidenceAndHandsEveryWindow(t *testing.T) {
	cfg := detector.DefaultConfig()
	cfg.Lateness = 0
	det, _ := detector.New(cfg)
	sink := &recordSink{}
	p := newPipeline(slog.New(slog.DiscardHandler), correlate.New(correlate.Config{}), det, nil, []Sink{sink})
	p.evidence = func(job string, rank int, start, end int64) *detector.GPUEvidence {
		return &detector.GPUEvidence{Index: rank, TempMaxC: 90}
	}
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
	p.flush(0)
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
