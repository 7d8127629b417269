package export

import (
	"testing"

	"github.com/slowrank/slowrank/detector"
)

func TestSampledIsStepDeterministic(t *testing.T) {
	n := 0
	for s := int64(0); s < 20000; s++ {
		if sampled(TraceID("job", s), 20) {
			n++
		}
	}
	if n < 800 || n > 1200 { // ~1000 expected
		t.Fatalf("%d of 20000 steps sampled with every=20", n)
	}
	if sampled(TraceID("job", 1), -1) {
		t.Fatal("negative SampleEvery must disable the baseline")
	}
	for s := int64(0); s < 10; s++ {
		if !sampled(TraceID("job", s), 1) {
			t.Fatal("every=1 must sample every step")
		}
	}
}

func TestDecideWorstVerdict(t *testing.T) {
	vs := []detector.Verdict{
		{Rank: 1, State: detector.StateUncertain, Phase: "host", Deviation: 0.5},
		{Rank: 1, State: detector.StateStraggler, Phase: "compute", Deviation: 0.1},
		{Rank: 2, State: detector.StateUncertain, Phase: "compute", AlertActive: true},
		{Rank: 3, State: detector.StateOK},
	}
	d := decide(vs)
	if d.worst[1].State != detector.StateStraggler || !d.alert[1] {
		t.Fatalf("rank 1 worst %+v", d.worst[1])
	}
	if !d.alert[2] {
		t.Fatal("uncertain with alert_active keeps the alert")
	}
	if _, ok := d.worst[3]; ok || len(d.byRank[1]) != 2 {
		t.Fatalf("ok verdicts must not label: %+v", d)
	}
}

func TestStepBufferSettleOlderWindows(t *testing.T) {
	b := newStepBuffer(Policy{}.withDefaults())
	for w := int64(0); w < 3; w++ {
		b.add(detector.Step{Job: "j", Step: w * 10, EndNS: w}, w)
	}
	b.add(detector.Step{Job: "k", Step: 0}, 0)
	out := b.settle(windowKey{"j", 1}, decide(nil))
	if len(out) != 2 || out[0].key.window != 0 || out[1].key.window != 1 || !out[1].d.settled || out[0].d.settled {
		t.Fatalf("settle returned %+v", out)
	}
	if b.n != 2 {
		t.Fatalf("%d facts left, want 2 (j/2 and k/0)", b.n)
	}
	if r := b.add(detector.Step{Job: "j", Step: 5}, 0); !r.isLate || r.late == nil {
		t.Fatalf("fact of settled window not late: %+v", r)
	}
	if r := b.add(detector.Step{Job: "k", Step: 5}, 0); r.isLate {
		t.Fatal("other job's window is not settled")
	}
}

func TestSelectFactsEmptyDecision(t *testing.T) {
	facts := []detector.Step{{Job: "j", Step: 1, Rank: 0}, {Job: "j", Step: 1, Rank: 1}}
	sel, over := selectFacts(facts, &decision{}, 1, 1000, true)
	if len(sel) != 2 || over != 0 || sel[0].cat != catBaseline {
		t.Fatalf("sel %+v over %d", sel, over)
	}
	sel, _ = selectFacts(facts, &decision{}, -1, 1000, true)
	if len(sel) != 0 {
		t.Fatalf("no baseline wanted, got %d", len(sel))
	}
}
