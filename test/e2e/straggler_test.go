package e2e

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/slowrank/slowrank/detector"
	"github.com/slowrank/slowrank/otel/export"
	"github.com/slowrank/slowrank/test/testutil"
)

const (
	e2eRanks       = 4
	e2eSlowRank    = 2
	stepsPerWindow = 10
	stepDur        = 50 * time.Millisecond
	e2eWindows     = 10
	firstSlow      = 3
	lastSlow       = 6
	recoverWindow  = 8
	sampleEvery    = 20 // the exporter's default
)

func slowWindow(w int64) bool { return w >= firstSlow && w <= lastSlow }

func e2eFact(job string, rank int, step int64, start, end int64, slow bool) detector.Step {
	compute, sync := 30.0, 15.0
	if slow && rank == e2eSlowRank {
		compute, sync = 45.0, 1.0
	} else if slow {
		sync = 16.0 // the others wait for rank 2
	}
	lag := 0.0
	last := slow && rank == e2eSlowRank
	return detector.Step{
		Kind: detector.KindStep, Job: job, Topo: 1, Rank: rank, Step: step, Host: "e2e-host",
		StartNS: start, EndNS: end,
		Phases: map[string]float64{
			detector.PhaseStep: float64(end-start) / 1e6, detector.PhaseCompute: compute,
			detector.PhaseHost: 3, detector.PhaseSyncWait: sync, detector.PhaseComm: 4,
		},
		GPU:         true,
		Workload:    &detector.Workload{FP: "9f2c01aa", Tokens: 8192},
		LastArrival: &last, ArrivalLagMS: &lag,
	}
}

func e2eVerdict(job string, w int64, state string, consecutive int) detector.Verdict {
	since := int64(firstSlow)
	return detector.Verdict{
		Kind: detector.KindVerdict, Job: job, Window: w, Rank: e2eSlowRank, State: state,
		Phase: detector.PhaseCompute, Hint: detector.HintGPUStreamStall,
		ValueMS: 45, ReferenceMS: 30, ReferenceRank: 0, Deviation: 0.5,
		ComparableRanks: []int{0, 1, 3}, ComparableCount: 3, Consecutive: consecutive, Coverage: 1,
		SinceWindow: &since,
	}
}

// sampledStep mirrors the exporter's baseline rule.
func sampledStep(job string, step int64) bool {
	id := export.TraceID(job, step)
	return binary.BigEndian.Uint64(id[8:])%sampleEvery == 0
}

// TestStragglerInJaegerAndPrometheus drives the otel package live (4 ranks,
// 50 ms steps, windows of 10 steps; rank 2 slow in compute in windows 3-6)
// through the collector (deploy/otelcol.yaml) into Jaeger and the
// collector's Prometheus endpoint, and checks what an operator would look at.
func TestStragglerInJaegerAndPrometheus(t *testing.T) {
	bin := testutil.ToolsBin(t, "jaeger", "otelcol")
	t.Cleanup(func() { goleak.VerifyNone(t, goleak.IgnoreCurrent()) })
	st := startStack(t, bin)

	job := fmt.Sprintf("e2e-%d", time.Now().UnixNano())
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	exp, err := export.New(context.Background(), export.Config{
		Job: job, HostName: "e2e-host", ServiceVersion: "e2e",
		Endpoint: "http://" + st.otlpGRPC, Protocol: export.ProtocolGRPC,
		MetricInterval: 250 * time.Millisecond, Env: emptyEnv, Logger: log,
	})
	if err != nil {
		t.Fatal(err)
	}
	exp.RecordTopology(detector.Topology{Kind: detector.KindTopology, Job: job, Version: 1,
		Ranks: []detector.RankInfo{{Rank: 0, Host: "e2e-host"}, {Rank: 1, Host: "e2e-host", LocalRank: 1},
			{Rank: 2, Host: "e2e-host", LocalRank: 2}, {Rank: 3, Host: "e2e-host", LocalRank: 3}}})

	// Watchers: Jaeger (each slow step's trace) and Prometheus (the gauge).
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	stepEnd := map[int64]int64{}     // step -> end ns (mono)
	settled := map[int64]bool{}      // window -> settled
	queryable := map[int64]int64{}   // step -> mono ns when its trace was complete in Jaeger
	var promSeen1, promSeen1At int64 // mono ns
	var settleSlow int64             // mono ns of the first straggler verdict
	var wg sync.WaitGroup
	wg.Go(func() { // Jaeger poller
		for ctx.Err() == nil {
			mu.Lock()
			var todo []int64
			for step := range stepEnd {
				if slowWindow(step/stepsPerWindow) && settled[step/stepsPerWindow] && queryable[step] == 0 {
					todo = append(todo, step)
				}
			}
			mu.Unlock()
			for _, step := range todo {
				var r jaegerResponse
				if err := getJSON(ctx, st.client, st.jaegerQuery+"/api/traces/"+export.TraceID(job, step).String(), &r); err != nil {
					continue
				}
				if len(r.Data) == 1 && countStepSpans(r.Data[0]) == e2eRanks && hasVerdictEvent(r.Data[0]) {
					now := testutil.MonoNow()
					mu.Lock()
					queryable[step] = now
					mu.Unlock()
				}
			}
			sleepCtx(ctx, 25*time.Millisecond)
		}
	})
	wg.Go(func() { // Prometheus poller
		for ctx.Err() == nil {
			if body, err := getText(st.client, st.prom); err == nil && stragglerValue(body, job, "2") == "1" {
				mu.Lock()
				if promSeen1 == 0 {
					promSeen1, promSeen1At = 1, testutil.MonoNow()
				}
				mu.Unlock()
			}
			sleepCtx(ctx, 50*time.Millisecond)
		}
	})

	// The live run: one fact per rank and step, a settle per window.
	runStart := time.Now()
	for w := int64(0); w < e2eWindows; w++ {
		for s := int64(0); s < stepsPerWindow; s++ {
			step := w*stepsPerWindow + s
			start := testutil.MonoNow()
			time.Sleep(stepDur)
			end := testutil.MonoNow()
			for r := 0; r < e2eRanks; r++ {
				exp.RecordStep(e2eFact(job, r, step, start, end, slowWindow(w)), w)
			}
			mu.Lock()
			stepEnd[step] = end
			mu.Unlock()
		}
		var vs []detector.Verdict
		switch {
		case slowWindow(w):
			vs = []detector.Verdict{e2eVerdict(job, w, detector.StateStraggler, int(w-firstSlow+1))}
		case w == recoverWindow:
			vs = []detector.Verdict{e2eVerdict(job, w, detector.StateRecovered, 0)}
		}
		exp.SettleWindow(job, w, vs)
		mu.Lock()
		settled[w] = true
		if w == firstSlow {
			settleSlow = testutil.MonoNow()
		}
		mu.Unlock()
	}
	runEnd := time.Now()

	// Wait for every slow step's trace (at most 30 s).
	want := (lastSlow - firstSlow + 1) * stepsPerWindow
	deadline := time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		n := len(queryable)
		mu.Unlock()
		if n == want || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	wg.Wait()

	// Latencies: step end -> whole trace queryable; and from the window's last
	// step (the pipeline itself: exporter queue, collector, Jaeger).
	var perStep, perWindow []time.Duration
	for step, at := range queryable {
		perStep = append(perStep, time.Duration(at-stepEnd[step]))
		if step%stepsPerWindow == stepsPerWindow-1 {
			perWindow = append(perWindow, time.Duration(at-stepEnd[step]))
		}
	}
	if len(queryable) != want {
		t.Fatalf("only %d of %d slow steps became queryable in Jaeger", len(queryable), want)
	}
	t.Logf("latency step end -> trace queryable in Jaeger (%d steps, window %v): median %v p95 %v max %v",
		len(perStep), stepsPerWindow*stepDur, percentile(perStep, 0.5), percentile(perStep, 0.95), percentile(perStep, 1))
	t.Logf("latency last step of window end -> trace queryable (%d windows): median %v p95 %v",
		len(perWindow), percentile(perWindow, 0.5), percentile(perWindow, 0.95))
	if promSeen1 == 0 {
		t.Fatalf("slowrank_straggler{rank=\"2\"} 1 never appeared on %s", st.prom)
	}
	t.Logf("latency first straggler verdict -> slowrank_straggler 1 on the Prometheus endpoint: %v", time.Duration(promSeen1At-settleSlow))

	// Search by tag, as an operator would in Jaeger's UI.
	q := url.Values{}
	q.Set("service", "slowrank")
	q.Set("tags", `{"slowrank.state":"straggler","slowrank.job.id":"`+job+`"}`)
	q.Set("start", fmt.Sprint(runStart.Add(-time.Minute).UnixMicro()))
	q.Set("end", fmt.Sprint(runEnd.Add(time.Minute).UnixMicro()))
	q.Set("limit", "1000")
	var found jaegerResponse
	if err := getJSON(context.Background(), st.client, st.jaegerQuery+"/api/traces?"+q.Encode(), &found); err != nil {
		t.Fatalf("search: %v", err)
	}
	if len(found.Data) != want {
		t.Fatalf("tag search found %d traces, want %d (one per slow step)", len(found.Data), want)
	}

	// One slow step's trace in full: all 4 ranks, the verdict on rank 2.
	slowStep := int64(4*stepsPerWindow + 5)
	var tr jaegerResponse
	if err := getJSON(context.Background(), st.client, st.jaegerQuery+"/api/traces/"+export.TraceID(job, slowStep).String(), &tr); err != nil {
		t.Fatalf("get trace: %v", err)
	}
	checkSlowTrace(t, tr.Data[0], job, slowStep)

	// The baseline: sampled healthy steps are there with all ranks, others
	// not. The last windows were settled just now: flush and give the
	// pipeline a few seconds.
	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer scancel()
	if err := exp.ForceFlush(sctx); err != nil {
		t.Fatalf("ForceFlush: %v", err)
	}
	var sampledSeen, unsampledChecked int
	for step := int64(0); step < e2eWindows*stepsPerWindow; step++ {
		if w := step / stepsPerWindow; slowWindow(w) {
			continue
		}
		var r jaegerResponse
		get := func() error {
			return getJSON(context.Background(), st.client, st.jaegerQuery+"/api/traces/"+export.TraceID(job, step).String(), &r)
		}
		switch {
		case sampledStep(job, step):
			err := get()
			for deadline := time.Now().Add(5 * time.Second); (err != nil || countStepSpans(r.Data[0]) != e2eRanks) && time.Now().Before(deadline); err = get() {
				time.Sleep(100 * time.Millisecond)
			}
			if err != nil || len(r.Data) != 1 || countStepSpans(r.Data[0]) != e2eRanks {
				t.Errorf("sampled healthy step %d: err %v, want all %d ranks", step, err, e2eRanks)
			}
			sampledSeen++
		case unsampledChecked < 10:
			err := get()
			if err == nil && len(r.Data) > 0 {
				t.Errorf("healthy unsampled step %d was exported", step)
			}
			unsampledChecked++
		}
	}
	t.Logf("baseline: %d sampled healthy steps found complete, %d unsampled ones absent", sampledSeen, unsampledChecked)

	// After recovery (window 8) the gauge goes back to 0.
	var body string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if body, err = getText(st.client, st.prom); err == nil && stragglerValue(body, job, "2") == "0" {
			break
		}
	}
	if v := stragglerValue(body, job, "2"); v != "0" {
		t.Fatalf("after recovery slowrank_straggler{rank=\"2\"} = %q, want 0", v)
	}
	for _, fam := range []string{"slowrank_step_duration_milliseconds_bucket", "slowrank_phase_duration_milliseconds_count",
		"slowrank_deviation", "slowrank_state", "slowrank_verdicts_total", "slowrank_verdict_latency_seconds_bucket",
		"slowrank_export_dropped_total", "slowrank_agent_cpu_time_seconds_total", "slowrank_agent_memory_rss_bytes"} {
		if !strings.Contains(body, "\n"+fam+"{") {
			t.Errorf("metric %s missing from the Prometheus endpoint", fam)
		}
	}

	start := time.Now()
	if err := exp.Shutdown(sctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	stats := exp.Stats()
	t.Logf("shutdown %v; exported %d spans; dropped spans %v facts %v; export errors %d",
		time.Since(start), stats.SpansExported, stats.SpansDropped, stats.FactsDropped, stats.ExportErrors)
	for reason, n := range stats.SpansDropped {
		if n != 0 {
			t.Errorf("%d spans dropped (%s) with a healthy collector", n, reason)
		}
	}
	st.client.CloseIdleConnections()
}

func countStepSpans(tr jaegerTrace) int {
	ranks := map[string]bool{}
	for _, s := range tr.Spans {
		if s.OperationName == export.SpanStep {
			ranks[tagString(s.Tags, string(export.AttrRank))] = true
		}
	}
	return len(ranks)
}

func hasVerdictEvent(tr jaegerTrace) bool {
	for _, s := range tr.Spans {
		for _, l := range s.Logs {
			if tagString(l.Fields, "event") == export.EventVerdict {
				return true
			}
		}
	}
	return false
}

func checkSlowTrace(t *testing.T, tr jaegerTrace, job string, step int64) {
	t.Helper()
	if tr.TraceID != export.TraceID(job, step).String() {
		t.Fatalf("trace id %s", tr.TraceID)
	}
	ranks := map[string]jaegerSpan{}
	children := 0
	for _, s := range tr.Spans {
		if tr.Processes[s.ProcessID].ServiceName != "slowrank" {
			t.Errorf("span %s of service %q", s.OperationName, tr.Processes[s.ProcessID].ServiceName)
		}
		switch {
		case s.OperationName == export.SpanStep:
			if len(s.References) != 0 {
				t.Errorf("train.step span has references %v; want a root span", s.References)
			}
			if got := tagString(s.Tags, string(export.AttrStep)); got != fmt.Sprint(step) {
				t.Errorf("slowrank.step %s", got)
			}
			ranks[tagString(s.Tags, string(export.AttrRank))] = s
		case strings.HasPrefix(s.OperationName, export.SpanPhasePrefix):
			children++
		}
	}
	if len(ranks) != e2eRanks {
		t.Fatalf("trace of step %d has train.step spans of ranks %v, want 4", step, keys(ranks))
	}
	if children != e2eRanks*4 {
		t.Errorf("%d phase spans, want %d", children, e2eRanks*4)
	}
	s2 := ranks["2"]
	for key, want := range map[string]string{
		"slowrank.state": "straggler", "slowrank.phase": "compute", "slowrank.hint": "gpu_stream_stall",
		"slowrank.reference_rank": "0", "slowrank.deviation": "0.5", "slowrank.job.id": job, "slowrank.local_rank": "2",
		"slowrank.phase.compute_ms": "45", "slowrank.workload.fp": "9f2c01aa", "otel.status_code": "ERROR",
	} {
		if got := tagString(s2.Tags, key); got != want {
			t.Errorf("rank 2 span tag %s = %q, want %q", key, got, want)
		}
	}
	var ev []jaegerKV
	for _, l := range s2.Logs {
		if tagString(l.Fields, "event") == export.EventVerdict {
			ev = l.Fields
		}
	}
	if ev == nil {
		t.Fatalf("rank 2 span has no %s event: %+v", export.EventVerdict, s2.Logs)
	}
	for key, want := range map[string]string{"state": "straggler", "phase": "compute", "rank": "2", "reference_rank": "0", "consecutive": "2"} {
		if got := tagString(ev, key); got != want {
			t.Errorf("verdict event %s = %q, want %q", key, got, want)
		}
	}
	if got := tagString(ranks["0"].Tags, "slowrank.state"); got != "ok" {
		t.Errorf("rank 0 state %q, want ok", got)
	}
}

func keys[M ~map[string]V, V any](m M) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// stragglerValue finds slowrank_straggler{...slowrank_job_id="job",...rank="rank"...}
// in a Prometheus text exposition and returns its value ("" if absent).
func stragglerValue(body, job, rank string) string {
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "slowrank_straggler{") {
			continue
		}
		if strings.Contains(line, `slowrank_job_id="`+job+`"`) && (strings.Contains(line, `,rank="`+rank+`"`) || strings.Contains(line, `{rank="`+rank+`"`)) &&
			strings.Contains(line, `phase="compute"`) {
			f := strings.Fields(line)
			return f[len(f)-1]
		}
	}
	return ""
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
