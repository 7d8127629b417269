package export

import (
	"context"
	"crypto/sha256"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/slowrank/slowrank/detector"
	"github.com/slowrank/slowrank/selfmetrics"
)

func TestTraceIDIsSHA256Prefix(t *testing.T) {
	sum := sha256.Sum256([]byte("slowrank/j1/120"))
	got := TraceID("j1", 120)
	if !slices.Equal(got[:], sum[:16]) {
		t.Fatalf("TraceID = %x, want %x", got, sum[:16])
	}
	if TraceID("j1", 121) == got || TraceID("j2", 120) == got {
		t.Fatal("trace ids of different (job, step) collide")
	}
	if SpanID("j1", 120, 0) == SpanID("j1", 120, 1) {
		t.Fatal("span ids of different ranks collide")
	}
}

// Two exporters (two hosts) put the ranks of one step into one trace with
// the same ids, and the child spans hang under their own rank's span.
func TestTraceIDsDeterministicAcrossExporters(t *testing.T) {
	a := newHarness(t, Policy{SampleEvery: 1}, QueueConfig{})
	b := newHarness(t, Policy{SampleEvery: 1}, QueueConfig{})
	for r := 0; r < 2; r++ {
		a.e.RecordStep(stepFact(testJob, r, 7, 0), 0)
	}
	for r := 2; r < 4; r++ {
		b.e.RecordStep(stepFact(testJob, r, 7, 0), 0)
	}
	// Host b also sees rank 1 (e.g. after a restart): identical ids.
	b.e.RecordStep(stepFact(testJob, 1, 7, 0), 0)
	a.e.SettleWindow(testJob, 0, nil)
	b.e.SettleWindow(testJob, 0, nil)
	a.flush(t)
	b.flush(t)

	want := TraceID(testJob, 7)
	ids := map[int]string{}
	for _, h := range []*harness{a, b} {
		for _, s := range h.spans.GetSpans() {
			if s.SpanContext.TraceID() != want {
				t.Fatalf("span %s in trace %s, want %s", s.Name, s.SpanContext.TraceID(), want)
			}
			if s.Name != SpanStep {
				if !s.Parent.IsValid() || s.Parent.TraceID() != want {
					t.Fatalf("child %s has parent %v", s.Name, s.Parent)
				}
				continue
			}
			if s.Parent.IsValid() {
				t.Fatalf("train.step has a parent %v; want a root span", s.Parent)
			}
			rank := int(attrOf(s.Attributes, AttrRank).AsInt64())
			sid := s.SpanContext.SpanID().String()
			if prev, ok := ids[rank]; ok && prev != sid {
				t.Fatalf("rank %d has span ids %s and %s", rank, prev, sid)
			}
			ids[rank] = sid
			if sid != SpanID(testJob, 7, rank).String() {
				t.Fatalf("rank %d span id %s, want %s", rank, sid, SpanID(testJob, 7, rank))
			}
		}
	}
	if len(ids) != 4 {
		t.Fatalf("ranks seen %v, want 4", ids)
	}
}

func attrOf(kvs []attribute.KeyValue, k attribute.Key) attribute.Value {
	for _, kv := range kvs {
		if kv.Key == k {
			return kv.Value
		}
	}
	return attribute.Value{}
}

func stepSpans(spans tracetest.SpanStubs) tracetest.SpanStubs {
	var out tracetest.SpanStubs
	for _, s := range spans {
		if s.Name == SpanStep {
			out = append(out, s)
		}
	}
	return out
}

// Anomalous windows export full trees for the straggler, all ranks of its
// steps side by side; healthy windows only the sampled baseline steps.
func TestPolicyAnomalousFullBaselineSampled(t *testing.T) {
	const every = 4
	h := newHarness(t, Policy{SampleEvery: every}, QueueConfig{})
	h.e.RecordTopology(detector.Topology{Kind: detector.KindTopology, Job: testJob, Version: 1,
		Ranks: []detector.RankInfo{{Rank: 2, Host: "h0", LocalRank: 2}}})
	for w := int64(0); w < 3; w++ {
		slow := 0.0
		if w == 1 {
			slow = 20
		}
		h.feedWindow(testJob, w, 4, 2, slow)
	}
	h.e.SettleWindow(testJob, 0, nil)
	h.e.SettleWindow(testJob, 1, []detector.Verdict{stragglerVerdict(testJob, 1, 2, detector.StateStraggler)})
	h.e.SettleWindow(testJob, 2, []detector.Verdict{stragglerVerdict(testJob, 2, 1, detector.StateUncertain)})
	h.flush(t)

	perWindowRank := map[[2]int64]int{}
	for _, s := range stepSpans(h.spans.GetSpans()) {
		w := attrOf(s.Attributes, AttrWindow).AsInt64()
		r := attrOf(s.Attributes, AttrRank).AsInt64()
		step := attrOf(s.Attributes, AttrStep).AsInt64()
		perWindowRank[[2]int64{w, r}]++
		cat := attrOf(s.Attributes, AttrExport).AsString()
		switch {
		case w == 1:
			// every rank of every step, side by side
		case w == 2 && r == 1:
			if cat != "anomalous" {
				t.Errorf("w2 rank1 step %d: export=%s", step, cat)
			}
		default:
			if !sampled(TraceID(testJob, step), every) || cat != "baseline" {
				t.Errorf("w%d rank %d step %d exported as %q but not sampled", w, r, step, cat)
			}
		}
		if w == 1 && r == 2 {
			if got := attrOf(s.Attributes, AttrState).AsString(); got != detector.StateStraggler {
				t.Errorf("straggler span state %q", got)
			}
			if s.Status.Code != codes.Error {
				t.Errorf("straggler span status %v", s.Status)
			}
			if got := attrOf(s.Attributes, AttrLocalRank).AsInt64(); got != 2 {
				t.Errorf("local rank %d", got)
			}
			if got := attrOf(s.Attributes, AttrHint).AsString(); got != detector.HintGPUStreamStall {
				t.Errorf("hint %q", got)
			}
			if got := attrOf(s.Attributes, AttrSlowPhase).AsString(); got != detector.PhaseCompute {
				t.Errorf("phase %q", got)
			}
			if got := attrOf(s.Attributes, PhaseAttr(detector.PhaseCompute)).AsFloat64(); got != 80 {
				t.Errorf("compute ms %v", got)
			}
			if len(s.Events) != 1 || s.Events[0].Name != EventVerdict {
				t.Fatalf("events %v", s.Events)
			}
			ev := s.Events[0].Attributes
			if attrOf(ev, "state").AsString() != detector.StateStraggler || attrOf(ev, "deviation").AsFloat64() != 0.333 ||
				!slices.Equal(attrOf(ev, "comparable_ranks").AsInt64Slice(), []int64{0, 1, 3}) ||
				attrOf(ev, "reference_rank").AsInt64() != 0 || attrOf(ev, "consecutive").AsInt64() != 3 {
				t.Errorf("verdict event attributes %v", ev)
			}
		} else if w == 1 {
			if got := attrOf(s.Attributes, AttrState).AsString(); got != detector.StateOK {
				t.Errorf("w1 rank %d state %q", r, got)
			}
			if s.Status.Code == codes.Error || len(s.Events) != 0 {
				t.Errorf("w1 rank %d: status %v events %d", r, s.Status, len(s.Events))
			}
		}
	}
	for r := int64(0); r < 4; r++ {
		if got := perWindowRank[[2]int64{1, r}]; got != stepsPerWindow {
			t.Errorf("window 1 rank %d: %d spans, want %d (side by side)", r, got, stepsPerWindow)
		}
	}
	if got := perWindowRank[[2]int64{2, 1}]; got != stepsPerWindow {
		t.Errorf("window 2 uncertain rank 1: %d spans, want all %d", got, stepsPerWindow)
	}

	// Children: 4 phases per step span, laid out from the step start.
	var slowChild int
	for _, s := range h.spans.GetSpans() {
		if s.Name == SpanStep {
			continue
		}
		if !strings.HasPrefix(s.Name, SpanPhasePrefix) {
			t.Fatalf("unexpected span %s", s.Name)
		}
		if s.Status.Code == codes.Error {
			slowChild++
			if s.Name != "phase.compute" {
				t.Errorf("slow child %s", s.Name)
			}
			if d := s.EndTime.Sub(s.StartTime); d != 80*time.Millisecond {
				t.Errorf("phase.compute bar %v, want 80ms", d)
			}
		}
	}
	if slowChild != stepsPerWindow {
		t.Errorf("%d slow phase.compute children, want %d", slowChild, stepsPerWindow)
	}
}

func TestBufferOverflowDropsOldestWindowCounted(t *testing.T) {
	h := newHarness(t, Policy{SampleEvery: 1, MaxBufferedSteps: 50}, QueueConfig{})
	h.feedWindow(testJob, 0, 4, -1, 0) // 40 facts
	h.feedWindow(testJob, 1, 4, -1, 0) // 40 more: window 0 must go
	st := h.e.Stats()
	if st.FactsDropped[DropBufferOverflow] != 40 || st.BufferedSteps != 40 {
		t.Fatalf("overflow dropped %d, buffered %d; want 40, 40", st.FactsDropped[DropBufferOverflow], st.BufferedSteps)
	}
	h.e.SettleWindow(testJob, 1, nil)
	h.flush(t)
	for _, s := range stepSpans(h.spans.GetSpans()) {
		if attrOf(s.Attributes, AttrWindow).AsInt64() != 1 {
			t.Fatalf("span of evicted window exported: %v", s.Attributes)
		}
	}
	rm := collect(t, h.reader)
	if v := sumInt(rm, selfmetrics.ExportDropped, map[attribute.Key]string{KeyReason: DropBufferOverflow}); v != 40 {
		t.Fatalf("%s{reason=buffer_overflow} = %d, want 40", selfmetrics.ExportDropped, v)
	}
}

func TestWindowBudgetPrioritisesAnomalous(t *testing.T) {
	// 5 spans per fact (step + 4 phases); budget 60 = 12 facts.
	h := newHarness(t, Policy{SampleEvery: 1, MaxSpansPerWindow: 60}, QueueConfig{})
	h.feedWindow(testJob, 0, 4, 3, 30)
	h.e.SettleWindow(testJob, 0, []detector.Verdict{stragglerVerdict(testJob, 0, 3, detector.StateCandidate)})
	h.flush(t)
	ss := stepSpans(h.spans.GetSpans())
	if len(ss) != 12 {
		t.Fatalf("%d step spans, want 12", len(ss))
	}
	n3 := 0
	for _, s := range ss {
		if attrOf(s.Attributes, AttrRank).AsInt64() == 3 {
			n3++
		}
	}
	if n3 != stepsPerWindow {
		t.Fatalf("anomalous rank 3 got %d spans, want all %d first", n3, stepsPerWindow)
	}
	if got := h.e.Stats().FactsDropped[DropWindowBudget]; got != 28 {
		t.Fatalf("budget drops %d, want 28", got)
	}
}

func TestSettleLagAndLateFacts(t *testing.T) {
	h := newHarness(t, Policy{SampleEvery: 1, SettleLag: 2}, QueueConfig{})
	h.e.RecordStep(stepFact(testJob, 0, 1, 0), 0)
	h.e.RecordStep(stepFact(testJob, 0, 11, 0), 1)
	if h.e.Stats().ForcedSettles != 0 {
		t.Fatal("forced too early")
	}
	h.e.RecordStep(stepFact(testJob, 0, 21, 0), 2) // window 0 is 2 behind: settled as baseline
	h.flush(t)
	ss := stepSpans(h.spans.GetSpans())
	if len(ss) != 1 || attrOf(ss[0].Attributes, AttrState).AsString() != "unsettled" {
		t.Fatalf("forced settle exported %d spans %v", len(ss), ss)
	}
	// Window 1 settles with a straggler; a late fact of it follows that decision.
	h.e.SettleWindow(testJob, 1, []detector.Verdict{stragglerVerdict(testJob, 1, 3, detector.StateStraggler)})
	h.e.RecordStep(stepFact(testJob, 3, 12, 20), 1)
	h.flush(t)
	st := h.e.Stats()
	if st.LateFacts != 1 {
		t.Fatalf("late facts %d", st.LateFacts)
	}
	var late bool
	for _, s := range stepSpans(h.spans.GetSpans()) {
		if attrOf(s.Attributes, AttrRank).AsInt64() == 3 {
			late = attrOf(s.Attributes, AttrState).AsString() == detector.StateStraggler
		}
	}
	if !late {
		t.Fatal("late fact of the straggler rank not exported as straggler")
	}
}

func TestMetrics(t *testing.T) {
	var src atomic.Int64
	src.Store(5)
	h2 := newHarnessWithCounters(t, selfmetrics.Counters([]string{selfmetrics.Agent}, func() map[string]int64 {
		return map[string]int64{"ringbuf_lost": src.Load(), "correlate_late": 2, "attach_errors": 1, "not_declared": 99}
	}))
	h2.feedWindow(testJob, 0, 4, 2, 20)
	h2.now = (stepsPerWindow*stepNS + 2*int64(time.Second)) // 2 s after the window's last step
	h2.e.SettleWindow(testJob, 0, []detector.Verdict{stragglerVerdict(testJob, 0, 2, detector.StateStraggler)})
	h2.flush(t)
	rm := collect(t, h2.reader)

	if v := gaugeInt(rm, MetricStraggler, map[attribute.Key]string{KeyRank: "2", KeyPhase: "compute", KeyHint: "gpu_stream_stall"}); v != 1 {
		t.Fatalf("straggler gauge %d, want 1", v)
	}
	if v := gaugeInt(rm, MetricState, map[attribute.Key]string{KeyRank: "2"}); v != StateCode(detector.StateStraggler) {
		t.Fatalf("state gauge %d", v)
	}
	if v := sumInt(rm, MetricVerdicts, map[attribute.Key]string{KeyState: "straggler"}); v != 1 {
		t.Fatalf("verdict counter %d", v)
	}
	if v := sumInt(rm, selfmetrics.RecordsDropped, map[attribute.Key]string{KeyReason: "ringbuf_full"}); v != 5 {
		t.Fatalf("records dropped %d", v)
	}
	if v := sumInt(rm, selfmetrics.RecordsDropped, map[attribute.Key]string{KeyReason: "queue_full"}); v != 0 {
		t.Fatalf("records dropped (queue full, never reported: 0) %d", v)
	}
	if v := sumInt(rm, selfmetrics.AttachErrors, nil); v != 1 {
		t.Fatalf("attach errors %d", v)
	}
	if v := sumInt(rm, selfmetrics.Undeclared, map[attribute.Key]string{KeyName: "not_declared"}); v != 99 {
		t.Fatalf("undeclared counter %d", v)
	}
	m, _ := findMetric(rm, MetricPhaseDuration)
	hist, ok := m.Data.(metricdata.Histogram[float64])
	if !ok || len(hist.DataPoints) != 16 { // 4 ranks x 4 phases
		t.Fatalf("phase duration histogram: %#v", m.Data)
	}
	m, _ = findMetric(rm, MetricVerdictLatency)
	lat, ok := m.Data.(metricdata.Histogram[float64])
	if !ok || len(lat.DataPoints) != 1 || lat.DataPoints[0].Count != 1 || lat.DataPoints[0].Sum != 2 {
		t.Fatalf("verdict latency %#v", m.Data)
	}
	for _, name := range []string{"slowrank.agent.cpu.time", "slowrank.agent.memory.rss", MetricStepDuration, "slowrank.export.spans"} {
		if _, ok := findMetric(rm, name); !ok {
			t.Errorf("metric %s missing", name)
		}
	}
	for _, kv := range rm.Resource.Attributes() {
		if kv.Key == "service.name" && kv.Value.AsString() != "slowrank" {
			t.Errorf("service.name %q", kv.Value.AsString())
		}
	}
	if v, ok := rm.Resource.Set().Value("host.name"); !ok || v.AsString() != "testhost" {
		t.Errorf("host.name %v", v)
	}
	if v, ok := rm.Resource.Set().Value(AttrJob); !ok || v.AsString() != testJob {
		t.Errorf("slowrank.job.id %v", v)
	}

	// Recovery brings the gauge back to 0; a window without verdicts
	// returns a candidate to ok but keeps an active alert.
	h2.e.SettleWindow(testJob, 1, []detector.Verdict{stragglerVerdict(testJob, 1, 2, detector.StateRecovered)})
	rm = collect(t, h2.reader)
	if v := gaugeInt(rm, MetricStraggler, map[attribute.Key]string{KeyRank: "2"}); v != 0 {
		t.Fatalf("straggler gauge after recovery %d", v)
	}
}

func newHarnessWithCounters(t *testing.T, src selfmetrics.Source) *harness {
	h := &harness{spans: tracetest.NewInMemoryExporter()}
	h.reader = sdkmetric.NewManualReader()
	e, err := New(context.Background(), Config{
		Job: testJob, HostName: "testhost", Env: testEnv(nil), SpanExporter: h.spans, MetricReader: h.reader,
		Self: []selfmetrics.Source{src}, NowMono: func() int64 { return h.now },
		MonoToWall: func(ns int64) time.Time { return time.Unix(1_700_000_000, ns) },
	})
	if err != nil {
		t.Fatal(err)
	}
	h.e = e
	t.Cleanup(func() { _ = e.Shutdown(context.Background()) })
	return h
}

func matches(set attribute.Set, want map[attribute.Key]string) bool {
	for k, v := range want {
		got, ok := set.Value(k)
		if !ok || got.String() != v {
			return false
		}
	}
	return true
}

func sumInt(rm metricdata.ResourceMetrics, name string, want map[attribute.Key]string) int64 {
	m, ok := findMetric(rm, name)
	if !ok {
		return -1
	}
	var n int64
	if s, ok := m.Data.(metricdata.Sum[int64]); ok {
		for _, dp := range s.DataPoints {
			if matches(dp.Attributes, want) {
				n += dp.Value
			}
		}
	}
	if s, ok := m.Data.(metricdata.Sum[float64]); ok { // the self-metrics
		for _, dp := range s.DataPoints {
			if matches(dp.Attributes, want) {
				n += int64(dp.Value)
			}
		}
	}
	return n
}

func gaugeInt(rm metricdata.ResourceMetrics, name string, want map[attribute.Key]string) int64 {
	m, ok := findMetric(rm, name)
	if !ok {
		return -1
	}
	if g, ok := m.Data.(metricdata.Gauge[int64]); ok {
		for _, dp := range g.DataPoints {
			if matches(dp.Attributes, want) {
				return dp.Value
			}
		}
	}
	return -1
}

// failingExporter fails every export after an optional delay.
type failingExporter struct {
	delay time.Duration
	calls atomic.Int64
}

func (f *failingExporter) ExportSpans(ctx context.Context, _ []sdktrace.ReadOnlySpan) error {
	f.calls.Add(1)
	select {
	case <-time.After(f.delay):
	case <-ctx.Done():
		return ctx.Err()
	}
	return errors.New("collector says 503")
}
func (f *failingExporter) Shutdown(context.Context) error { return nil }

func TestQueueCountsFailuresAndOverflow(t *testing.T) {
	fx := &failingExporter{delay: 50 * time.Millisecond}
	e, err := New(context.Background(), Config{
		Env: testEnv(map[string]string{"OTEL_METRICS_EXPORTER": "none"}), SpanExporter: fx,
		Policy: Policy{SampleEvery: 1}, Queue: QueueConfig{MaxQueueSize: 64, MaxExportBatchSize: 16, BatchTimeout: 10 * time.Millisecond},
		MonoToWall: func(ns int64) time.Time { return time.Unix(0, ns) },
	})
	if err != nil {
		t.Fatal(err)
	}
	before := e.Stats().ExportErrors
	for w := int64(0); w < 5; w++ {
		for s := w * 10; s < w*10+10; s++ {
			for r := 0; r < 4; r++ {
				e.RecordStep(stepFact("q", r, s, 0), w)
			}
		}
		e.SettleWindow("q", w, nil)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_ = e.Shutdown(ctx)
	if d := time.Since(start); d > time.Second {
		t.Fatalf("Shutdown took %v with a 300ms deadline", d)
	}
	// The export goroutine finishes its accounting right after the
	// deadline (its export call gets the same deadline).
	total := int64(5 * 10 * 4 * 5) // facts x (1 + 4 phases)
	var st Stats
	var got int64
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		st = e.Stats()
		got = st.SpansExported + st.SpansDropped[DropQueueFull] + st.SpansDropped[DropExportFailed] + st.SpansDropped[DropShutdown]
		if got == total {
			break
		}
	}
	if got != total {
		t.Fatalf("spans accounted %d (%+v), want %d", got, st, total)
	}
	if st.SpansDropped[DropQueueFull] == 0 || st.SpansDropped[DropExportFailed] == 0 || st.SpansExported != 0 {
		t.Fatalf("want queue_full and export_failed drops, none exported: %+v", st)
	}
	if st.ExportErrors <= before {
		t.Fatalf("export errors not counted: %d -> %d", before, st.ExportErrors)
	}
}

func TestShutdownIdempotentAndRecordAfterwards(t *testing.T) {
	h := newHarness(t, Policy{SampleEvery: 1}, QueueConfig{})
	h.e.RecordStep(stepFact(testJob, 0, 0, 0), 0)
	var n int
	h.e.tp.RegisterSpanProcessor(countEnds{&n})
	if err := h.e.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	// The buffered window leaves as baseline at shutdown (5 spans).
	if n != 5 {
		t.Fatalf("%d spans ended at shutdown, want 5", n)
	}
	h.e.RecordStep(stepFact(testJob, 0, 1, 0), 0)
	h.e.SettleWindow(testJob, 0, nil)
	h.e.RecordSummary(detector.Summary{Job: testJob})
	if err := h.e.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestSummarySpan(t *testing.T) {
	h := newHarness(t, Policy{}, QueueConfig{})
	wr := 2
	h.e.RecordSummary(detector.Summary{Kind: detector.KindSummary, Job: testJob, Stragglers: []int{2}, WorstRank: &wr, WorstPhase: "compute", WorstState: "straggler"})
	h.flush(t)
	ss := h.spans.GetSpans()
	if len(ss) != 1 || ss[0].Name != SpanSummary || ss[0].SpanContext.TraceID() != SummaryTraceID(testJob) || ss[0].Status.Code != codes.Error {
		t.Fatalf("summary spans %v", ss)
	}
}

type countEnds struct{ n *int }

func (c countEnds) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (c countEnds) OnEnd(sdktrace.ReadOnlySpan)                     { *c.n++ }
func (c countEnds) Shutdown(context.Context) error                  { return nil }
func (c countEnds) ForceFlush(context.Context) error                { return nil }

func TestForgetJobExportsAndDropsState(t *testing.T) {
	h := newHarness(t, Policy{SampleEvery: 1}, QueueConfig{})
	h.feedWindow("gone", 0, 2, -1, 0)
	h.feedWindow(testJob, 0, 2, -1, 0)
	h.e.SettleWindow("gone", 0, nil) // nothing left for window 0 of "gone"
	h.e.RecordStep(stepFact("gone", 0, 10, 0), 1)
	h.e.SettleWindow("gone", 0, []detector.Verdict{stragglerVerdict("gone", 0, 1, detector.StateStraggler)})
	h.e.ForgetJob("gone")
	h.flush(t)
	if st := h.e.Stats(); st.BufferedSteps != 2*stepsPerWindow {
		t.Fatalf("%d facts buffered, want only %s's %d", st.BufferedSteps, testJob, 2*stepsPerWindow)
	}
	rm := collect(t, h.reader)
	if v := gaugeInt(rm, MetricStraggler, map[attribute.Key]string{AttrJob: "gone"}); v != -1 {
		t.Fatalf("forgotten job still has a straggler series (%d)", v)
	}
	var gone int
	for _, s := range stepSpans(h.spans.GetSpans()) {
		if attrOf(s.Attributes, AttrJob).AsString() == "gone" {
			gone++
		}
	}
	if gone != 2*stepsPerWindow+1 {
		t.Fatalf("%d spans of the forgotten job, want %d", gone, 2*stepsPerWindow+1)
	}
}

func TestErrorHandlerCounts(t *testing.T) {
	installErrorHandler()
	before := exportErrors.Load()
	otel.Handle(errors.New("boom"))
	otel.Handle(errors.New("boom again"))
	if got := exportErrors.Load() - before; got != 2 {
		t.Fatalf("counted %d errors, want 2", got)
	}
}

func TestStdoutExporter(t *testing.T) {
	var buf strings.Builder
	var mu sync.Mutex
	w := writerFunc(func(p []byte) (int, error) { mu.Lock(); defer mu.Unlock(); return buf.Write(p) })
	e, err := New(context.Background(), Config{Env: testEnv(map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none"}),
		Stdout: w, Policy: Policy{SampleEvery: 1}, MonoToWall: func(ns int64) time.Time { return time.Unix(0, ns) }})
	if err != nil {
		t.Fatal(err)
	}
	e.RecordStep(stepFact(testJob, 0, 1, 0), 0)
	e.SettleWindow(testJob, 0, nil)
	if err := e.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(buf.String(), `"Name": "train.step"`) || !strings.Contains(buf.String(), TraceID(testJob, 1).String()) {
		t.Fatalf("stdout exporter output lacks the span:\n%.500s", buf.String())
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// TestCounterKeysDeclared: the keys the exporter reports are declared in
// selfmetrics.Table (the forwarder's: otel/forward).
func TestCounterKeysDeclared(t *testing.T) {
	h := newHarnessWithCounters(t, selfmetrics.Source{Observe: func(func(string, float64, ...string)) {}})
	for k := range h.e.Counters() {
		if _, s, ok := selfmetrics.Lookup(k); !ok || strings.HasSuffix(s.Key, "*") {
			t.Errorf("counter %q is not declared in selfmetrics.Table", k)
		}
	}
}
