package export

import (
	"context"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/slowrank/slowrank/detector"
)

const (
	testJob        = "j1"
	stepNS         = int64(100 * time.Millisecond)
	stepsPerWindow = 10
)

// testEnv returns an environment lookup that knows only kv.
func testEnv(kv map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		v, ok := kv[k]
		return v, ok
	}
}

type harness struct {
	e      *Exporter
	spans  *tracetest.InMemoryExporter
	reader *sdkmetric.ManualReader
	now    int64
}

func newHarness(t testing.TB, p Policy, q QueueConfig) *harness {
	t.Helper()
	h := &harness{spans: tracetest.NewInMemoryExporter(), reader: sdkmetric.NewManualReader()}
	e, err := New(context.Background(), Config{
		Job:          testJob,
		HostName:     "testhost",
		Env:          testEnv(nil),
		SpanExporter: h.spans,
		MetricReader: h.reader,
		Policy:       p,
		Queue:        q,
		NowMono:      func() int64 { return h.now },
		MonoToWall:   func(ns int64) time.Time { return time.Unix(1_700_000_000, ns) },
	})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	h.e = e
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = e.Shutdown(ctx)
	})
	return h
}

func (h *harness) flush(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := h.e.ForceFlush(ctx); err != nil {
		t.Fatalf("ForceFlush: %v", err)
	}
}

// stepFact builds rank's fact of step; slow adds ms to compute.
func stepFact(job string, rank int, step int64, slow float64) detector.Step {
	start := step * stepNS
	compute := 60 + slow
	return detector.Step{
		Kind: detector.KindStep, Job: job, Topo: 1, Rank: rank, Step: step, Host: "h0",
		StartNS: start, EndNS: start + stepNS,
		Phases: map[string]float64{
			detector.PhaseStep: 100, detector.PhaseCompute: compute, detector.PhaseHost: 10,
			detector.PhaseSyncWait: 20, detector.PhaseComm: 15,
		},
		GPU:      true,
		Workload: &detector.Workload{FP: "9f2c01aa", Tokens: 8192},
	}
}

func stragglerVerdict(job string, window int64, rank int, state string) detector.Verdict {
	return detector.Verdict{
		Kind: detector.KindVerdict, Job: job, Window: window,
		WindowStartNS: window * stepsPerWindow * stepNS, WindowEndNS: (window + 1) * stepsPerWindow * stepNS,
		Rank: rank, State: state, Phase: detector.PhaseCompute, Hint: detector.HintGPUStreamStall,
		ValueMS: 80, ReferenceMS: 60, ReferenceRank: 0, Deviation: 0.333,
		ComparableRanks: []int{0, 1, 3}, ComparableCount: 3, Consecutive: 3, Coverage: 1,
	}
}

// feedWindow records all ranks' facts of one window.
func (h *harness) feedWindow(job string, window int64, ranks int, slowRank int, slow float64) {
	for s := window * stepsPerWindow; s < (window+1)*stepsPerWindow; s++ {
		for r := 0; r < ranks; r++ {
			d := 0.0
			if r == slowRank {
				d = slow
			}
			h.e.RecordStep(stepFact(job, r, s, d), window)
		}
	}
}

func collect(t testing.TB, r *sdkmetric.ManualReader) metricdata.ResourceMetrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatalf("Collect: %v", err)
	}
	return rm
}

func findMetric(rm metricdata.ResourceMetrics, name string) (metricdata.Metrics, bool) {
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				return m, true
			}
		}
	}
	return metricdata.Metrics{}, false
}
