package export

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/slowrank/slowrank/detector"
)

type discardExporter struct{ n atomic.Int64 }

func (d *discardExporter) ExportSpans(_ context.Context, s []sdktrace.ReadOnlySpan) error {
	d.n.Add(int64(len(s)))
	return nil
}
func (d *discardExporter) Shutdown(context.Context) error { return nil }

// BenchmarkExportStep measures the agent-side cost of one step fact of one
// rank (one op): duration metrics, buffering, settling, span building and
// handing the spans to an exporter that discards them. 8 ranks, windows of
// 10 steps. "healthy": no verdicts (baseline 1/20 steps exported);
// "straggler": rank 3 holds an alert in every window, so every step of every
// rank is exported side by side (the worst case).
func BenchmarkExportStep(b *testing.B) {
	for _, tc := range []struct {
		name      string
		straggler bool
	}{{"healthy", false}, {"straggler", true}} {
		b.Run(tc.name, func(b *testing.B) {
			const ranks = 8
			dx := &discardExporter{}
			e, err := New(context.Background(), Config{
				Job: "bench", HostName: "h", Env: testEnv(nil), SpanExporter: dx, MetricReader: sdkmetric.NewManualReader(),
				Queue:      QueueConfig{MaxQueueSize: 1 << 20, SettleQueue: 1 << 16},
				Policy:     Policy{MaxBufferedSteps: 1 << 20},
				MonoToWall: func(ns int64) time.Time { return time.Unix(0, ns) },
				NowMono:    func() int64 { return 0 },
			})
			if err != nil {
				b.Fatal(err)
			}
			facts := make([]detector.Step, ranks)
			b.ReportAllocs()
			b.ResetTimer()
			var step int64
			for i := 0; i < b.N; {
				window := step / stepsPerWindow
				for r := 0; r < ranks && i < b.N; r, i = r+1, i+1 {
					facts[r] = stepFact("bench", r, step, 0)
					e.RecordStep(facts[r], window)
				}
				step++
				if step%stepsPerWindow == 0 {
					var vs []detector.Verdict
					if tc.straggler {
						vs = []detector.Verdict{stragglerVerdict("bench", window, 3, detector.StateStraggler)}
					}
					e.SettleWindow("bench", window, vs)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := e.Shutdown(ctx); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			st := e.Stats()
			for k, v := range st.SpansDropped {
				if v != 0 {
					b.Fatalf("dropped %d spans (%s): benchmark invalid", v, k)
				}
			}
			b.ReportMetric(float64(dx.n.Load())/float64(b.N), "spans/op")
		})
	}
}
