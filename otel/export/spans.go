package export

import (
	"context"
	"crypto/sha256"
	"fmt"
	"slices"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/slowrank/slowrank/detector"
	"github.com/slowrank/slowrank/otel/wire"
)

// Span and span attribute names. Metric data points use AttrJob and the
// plain keys of metrics.go.
const (
	SpanStep        = wire.SpanStep
	SpanPhasePrefix = "phase." // + phase name
	SpanSummary     = "slowrank.job.summary"
	EventVerdict    = "slowrank.verdict"

	// The step fields' keys are the fact wire schema's (package wire): the
	// aggregator decodes train.step spans with them too.
	AttrJob            = attribute.Key(wire.AttrJob)
	AttrRank           = attribute.Key(wire.AttrRank)
	AttrLocalRank      = attribute.Key("slowrank.local_rank")
	AttrStep           = attribute.Key(wire.AttrStep)
	AttrHost           = attribute.Key(wire.AttrHost)
	AttrWindow         = attribute.Key("slowrank.window")
	AttrGPU            = attribute.Key(wire.AttrGPU)
	AttrWorkloadFP     = attribute.Key(wire.AttrWorkloadFP)
	AttrWorkloadTokens = attribute.Key(wire.AttrWorkloadTokens)
	AttrTopo           = attribute.Key(wire.AttrTopo)
	AttrEpoch          = attribute.Key(wire.AttrEpoch)
	AttrLastArrival    = attribute.Key(wire.AttrLastArrival)
	AttrArrivalLagMS   = attribute.Key(wire.AttrArrivalLagMS)
	AttrDevLast        = attribute.Key(wire.AttrDevLast)
	AttrDevLagMS       = attribute.Key(wire.AttrDevLagMS)
	AttrDevCollMS      = attribute.Key(wire.AttrDevCollMS)
	// AttrExport says why the span was exported: anomalous, compare, baseline.
	AttrExport = attribute.Key("slowrank.export")
	// AttrState is the rank's worst verdict state in the window ("ok" when
	// the window settled without one, "unsettled" when it never settled).
	AttrState         = attribute.Key("slowrank.state")
	AttrDeviation     = attribute.Key("slowrank.deviation")
	AttrSlowPhase     = attribute.Key("slowrank.phase") // the verdict's (slow) phase
	AttrReferenceRank = attribute.Key("slowrank.reference_rank")
	AttrHint          = attribute.Key("slowrank.hint")
	AttrValueMS       = attribute.Key("slowrank.value_ms")
	AttrReferenceMS   = attribute.Key("slowrank.reference_ms")
	AttrAlertActive   = attribute.Key("slowrank.alert_active")
	// On phase.<name> spans: the phase and its measured value.
	AttrPhaseName = attribute.Key("slowrank.phase.name")
	AttrPhaseMS   = attribute.Key("slowrank.phase.ms")
)

// PhaseAttr is the train.step attribute of a phase value:
// slowrank.phase.<name>_ms (wire.PhaseAttr).
func PhaseAttr(phase string) attribute.Key { return attribute.Key(wire.PhaseAttr(phase)) }

// emitWindow builds the spans of one settled window per the policy.
func (e *Exporter) emitWindow(sw settledWindow) {
	if sw.flushed != nil {
		close(sw.flushed)
		return
	}
	if e.tracer != nil && len(sw.facts) > 0 {
		sel, over := selectFacts(sw.facts, sw.d, e.policy.SampleEvery, e.policy.MaxSpansPerWindow, !e.policy.NoPhaseSpans)
		e.stats.dropBudget.Add(int64(over))
		e.mu.Lock()
		topo := e.topo[sw.key.job]
		e.mu.Unlock()
		urgent := false
		for i := range sel {
			e.emitStep(&sel[i], sw.key.window, sw.d, topo)
			urgent = urgent || sel[i].cat != catBaseline
		}
		if urgent {
			for _, p := range e.procs {
				p.kick()
			}
		}
	}
	if sw.verdicts != nil && e.inst != nil {
		e.inst.recordLatency(e.nowMono(), sw.maxEnd, sw.verdicts)
	}
}

func (e *Exporter) emitStep(f *selectedFact, window int64, d *decision, topo map[int]detector.RankInfo) {
	s := &f.step
	tid := TraceID(s.Job, s.Step)
	start, end := e.monoToWall(s.StartNS), e.monoToWall(s.EndNS)
	if end.Before(start) {
		end = start
	}
	attrs := make([]attribute.KeyValue, 0, 36+len(s.Phases))
	attrs = append(attrs,
		AttrJob.String(s.Job), AttrRank.Int(s.Rank), AttrStep.Int64(s.Step), AttrWindow.Int64(window),
		AttrGPU.Bool(s.GPU), AttrExport.String(categoryNames[f.cat]))
	host := s.Host
	if ri, ok := topo[s.Rank]; ok {
		attrs = append(attrs, AttrLocalRank.Int(ri.LocalRank))
		if host == "" {
			host = ri.Host
		}
		attrs = placementAttrs(attrs, ri) // placement.go
	}
	if host != "" {
		attrs = append(attrs, AttrHost.String(host))
	}
	if s.Topo != 0 {
		attrs = append(attrs, AttrTopo.Int(s.Topo))
	}
	if s.Workload != nil {
		if s.Workload.FP != "" {
			attrs = append(attrs, AttrWorkloadFP.String(s.Workload.FP))
		}
		if s.Workload.Tokens != 0 {
			attrs = append(attrs, AttrWorkloadTokens.Int64(s.Workload.Tokens))
		}
	}
	if s.Epoch != 0 {
		attrs = append(attrs, AttrEpoch.Int(s.Epoch))
	}
	if s.LastArrival != nil {
		attrs = append(attrs, AttrLastArrival.Bool(*s.LastArrival))
	}
	if s.ArrivalLagMS != nil {
		attrs = append(attrs, AttrArrivalLagMS.Float64(*s.ArrivalLagMS))
	}
	if s.DeviceLastArrival != nil {
		attrs = append(attrs, AttrDevLast.Bool(*s.DeviceLastArrival))
	}
	if s.DeviceArrivalLagMS != nil {
		attrs = append(attrs, AttrDevLagMS.Float64(*s.DeviceArrivalLagMS))
	}
	if s.DeviceCollMS != nil {
		attrs = append(attrs, AttrDevCollMS.Float64(*s.DeviceCollMS))
	}
	names := make([]string, 0, len(s.Phases))
	for name, v := range s.Phases {
		attrs = append(attrs, PhaseAttr(name).Float64(v))
		if name != detector.PhaseStep {
			names = append(names, name)
		}
	}
	w, labelled := d.worst[s.Rank]
	alert := labelled && alertActive(w)
	switch {
	case labelled:
		attrs = append(attrs, AttrState.String(w.State), AttrSlowPhase.String(w.Phase), AttrDeviation.Float64(w.Deviation),
			AttrReferenceRank.Int(w.ReferenceRank), AttrValueMS.Float64(w.ValueMS), AttrReferenceMS.Float64(w.ReferenceMS))
		if w.Hint != "" {
			attrs = append(attrs, AttrHint.String(w.Hint))
		}
		if w.AlertActive {
			attrs = append(attrs, AttrAlertActive.Bool(true))
		}
	case d.settled:
		attrs = append(attrs, AttrState.String(detector.StateOK))
	default:
		attrs = append(attrs, AttrState.String("unsettled"))
	}

	base := context.Background()
	_, span := e.tracer.Start(withIDs(base, tid, SpanID(s.Job, s.Step, s.Rank)), SpanStep,
		trace.WithTimestamp(start), trace.WithAttributes(attrs...), trace.WithSpanKind(trace.SpanKindInternal))
	for _, v := range d.byRank[s.Rank] {
		span.AddEvent(EventVerdict, trace.WithTimestamp(end), trace.WithAttributes(verdictAttrs(&v)...))
	}
	if alert {
		span.SetStatus(codes.Error, fmt.Sprintf("straggler: %s %+.1f%% vs rank %d (%s)", w.Phase, w.Deviation*100, w.ReferenceRank, w.Hint))
	}
	if !e.policy.NoPhaseSpans {
		slices.Sort(names)
		for _, name := range names {
			ms := s.Phases[name]
			cend := start.Add(time.Duration(ms * float64(time.Millisecond)))
			if cend.After(end) || ms < 0 {
				cend = end
			}
			cctx := trace.ContextWithSpan(withIDs(base, tid, PhaseSpanID(s.Job, s.Step, s.Rank, name)), span)
			_, c := e.tracer.Start(cctx, SpanPhasePrefix+name, trace.WithTimestamp(start),
				trace.WithAttributes(AttrRank.Int(s.Rank), AttrPhaseName.String(name), AttrPhaseMS.Float64(ms)))
			if alert && name == w.Phase {
				c.SetStatus(codes.Error, "slow phase")
			}
			c.End(trace.WithTimestamp(cend))
		}
	}
	span.End(trace.WithTimestamp(end))
}

// verdictAttrs mirrors the JSONL verdict (DESIGN.md 5.2) field by field.
func verdictAttrs(v *detector.Verdict) []attribute.KeyValue {
	a := []attribute.KeyValue{
		attribute.String("job", v.Job),
		attribute.Int64("window", v.Window),
		attribute.Int64("window_start_ns", v.WindowStartNS),
		attribute.Int64("window_end_ns", v.WindowEndNS),
		attribute.Int("rank", v.Rank),
		attribute.String("state", v.State),
		attribute.String("phase", v.Phase),
		attribute.String("hint", v.Hint),
		attribute.Float64("value_ms", v.ValueMS),
		attribute.Float64("reference_ms", v.ReferenceMS),
		attribute.Int("reference_rank", v.ReferenceRank),
		attribute.Float64("deviation", v.Deviation),
		attribute.IntSlice("comparable_ranks", v.ComparableRanks),
		attribute.Int("comparable_count", v.ComparableCount),
		attribute.Int("consecutive", v.Consecutive),
		attribute.Float64("coverage", v.Coverage),
		attribute.Bool("workload_evidence_degraded", v.WorkloadEvidenceDegraded),
		attribute.String("reason", v.Reason),
		attribute.Bool("alert_active", v.AlertActive),
	}
	if v.Cohort != "" {
		a = append(a, attribute.String("cohort", v.Cohort))
	}
	if v.Topo != 0 {
		a = append(a, attribute.Int("topo", v.Topo))
	}
	if v.SinceWindow != nil {
		a = append(a, attribute.Int64("since_window", *v.SinceWindow))
	}
	if v.LastArrivalShare != nil {
		a = append(a, attribute.Float64("last_arrival_share", *v.LastArrivalShare))
	}
	if v.DeviceLastArrivalShare != nil {
		a = append(a, attribute.Float64("device_last_arrival_share", *v.DeviceLastArrivalShare))
	}
	if v.DeviceCollMS != nil {
		a = append(a, attribute.Float64("device_coll_ms", *v.DeviceCollMS), attribute.Float64("device_coll_peer_ms", *v.DeviceCollPeerMS))
	}
	return a
}

// SummaryTraceID is the trace of a job's summary span: the first 16 bytes
// of SHA-256("slowrank/" + job + "/summary").
func SummaryTraceID(job string) trace.TraceID {
	sum := sha256.Sum256([]byte("slowrank/" + job + "/summary"))
	var id trace.TraceID
	copy(id[:], sum[:16])
	return id
}

func (e *Exporter) emitSummary(s detector.Summary) {
	now := time.Now()
	attrs := []attribute.KeyValue{
		AttrJob.String(s.Job),
		attribute.IntSlice("slowrank.stragglers", s.Stragglers),
		attribute.Int64("slowrank.windows", s.Windows),
		attribute.Int64("slowrank.facts", s.Facts),
		attribute.Int64("slowrank.verdicts", s.Verdicts),
		attribute.Int64("slowrank.alerts", s.Alerts),
		attribute.Int64("slowrank.late", s.Late),
		attribute.Int64("slowrank.duplicates", s.Duplicates),
		attribute.Int64("slowrank.evicted", s.Evicted),
	}
	if s.WorstRank != nil {
		attrs = append(attrs, attribute.Int("slowrank.worst_rank", *s.WorstRank),
			AttrSlowPhase.String(s.WorstPhase), AttrState.String(s.WorstState))
	}
	if s.WorstDeviation != nil {
		attrs = append(attrs, AttrDeviation.Float64(*s.WorstDeviation))
	}
	ctx := withIDs(context.Background(), SummaryTraceID(s.Job), spanIDOf("slowrank/"+s.Job+"/summary"))
	_, span := e.tracer.Start(ctx, SpanSummary, trace.WithTimestamp(now), trace.WithAttributes(attrs...))
	if len(s.Stragglers) > 0 {
		span.SetStatus(codes.Error, fmt.Sprintf("stragglers at the end: %v", s.Stragglers))
	}
	span.End(trace.WithTimestamp(now))
}
