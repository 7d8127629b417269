package export

import (
	"context"
	"sync"

	"github.com/prometheus/procfs"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/slowrank/slowrank/detector"
	"github.com/slowrank/slowrank/selfmetrics"
)

// Metric names (OpenTelemetry; the collector's Prometheus exporter turns
// dots into underscores and adds unit and _total suffixes). These are the
// detector's results; slowrank's own health metrics (records dropped, late,
// duplicate, attach errors, export.*, CPU and RSS, ...) are declared in
// selfmetrics.Table.
const (
	// Per-rank metrics also carry the rank's placement labels (placement.go).
	MetricStepDuration   = "slowrank.step.duration"   // histogram, ms; job, rank
	MetricPhaseDuration  = "slowrank.phase.duration"  // histogram, ms; job, rank, phase
	MetricDeviation      = "slowrank.deviation"       // gauge; job, rank, phase
	MetricStraggler      = "slowrank.straggler"       // gauge 0/1; job, rank, phase, hint
	MetricState          = "slowrank.state"           // gauge, StateCode; job, rank, phase
	MetricVerdicts       = "slowrank.verdicts"        // counter; job, state, phase
	MetricVerdictLatency = "slowrank.verdict.latency" // histogram, s; job
)

// Metric attribute keys. The job is AttrJob ("slowrank.job.id", label
// slowrank_job_id in Prometheus): a plain "job" would collide with the
// job label that Prometheus derives from service.name.
const (
	KeyRank   = attribute.Key("rank")
	KeyPhase  = attribute.Key("phase")
	KeyHint   = attribute.Key("hint")
	KeyState  = attribute.Key("state")
	KeyReason = attribute.Key("reason")
	KeySignal = attribute.Key("signal")
	KeyUnit   = attribute.Key("unit")
	KeyName   = attribute.Key("name")
)

var (
	durationBucketsMS = []float64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 30000, 60000}
	latencyBucketsS   = []float64{0.1, 0.25, 0.5, 1, 2, 3, 5, 7.5, 10, 15, 20, 30, 60, 120}
)

const maxCachedAttrSets = 1 << 16

type attrKey struct {
	job    string
	rank   int
	phase  string
	labels rankLabels
}

type instruments struct {
	stepDur, phaseDur metric.Float64Histogram
	verdicts          metric.Int64Counter
	latency           metric.Float64Histogram

	mu    sync.Mutex
	attrs map[attrKey]metric.MeasurementOption
}

func newInstruments(m metric.Meter, e *Exporter, self []selfmetrics.Source) (*instruments, error) {
	in := &instruments{attrs: map[attrKey]metric.MeasurementOption{}}
	var err error
	if in.stepDur, err = m.Float64Histogram(MetricStepDuration, metric.WithUnit(result(MetricStepDuration).Unit), metric.WithDescription(result(MetricStepDuration).Desc),
		metric.WithExplicitBucketBoundaries(durationBucketsMS...)); err != nil {
		return nil, err
	}
	if in.phaseDur, err = m.Float64Histogram(MetricPhaseDuration, metric.WithUnit(result(MetricPhaseDuration).Unit), metric.WithDescription(result(MetricPhaseDuration).Desc),
		metric.WithExplicitBucketBoundaries(durationBucketsMS...)); err != nil {
		return nil, err
	}
	if in.verdicts, err = m.Int64Counter(MetricVerdicts, metric.WithUnit(result(MetricVerdicts).Unit), metric.WithDescription(result(MetricVerdicts).Desc)); err != nil {
		return nil, err
	}
	if in.latency, err = m.Float64Histogram(MetricVerdictLatency, metric.WithUnit(result(MetricVerdictLatency).Unit), metric.WithDescription(result(MetricVerdictLatency).Desc),
		metric.WithExplicitBucketBoundaries(latencyBucketsS...)); err != nil {
		return nil, err
	}

	dev, err := m.Float64ObservableGauge(MetricDeviation, metric.WithUnit(result(MetricDeviation).Unit), metric.WithDescription(result(MetricDeviation).Desc))
	if err != nil {
		return nil, err
	}
	strag, err := m.Int64ObservableGauge(MetricStraggler, metric.WithUnit(result(MetricStraggler).Unit), metric.WithDescription(result(MetricStraggler).Desc))
	if err != nil {
		return nil, err
	}
	state, err := m.Int64ObservableGauge(MetricState, metric.WithUnit(result(MetricState).Unit), metric.WithDescription(result(MetricState).Desc))
	if err != nil {
		return nil, err
	}
	_, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		labels := e.allRankLabels()
		e.series.observe(func(k seriesKey, v seriesVal) {
			kv := labels[k.job][k.rank].appendTo([]attribute.KeyValue{AttrJob.String(k.job), KeyRank.Int(k.rank), KeyPhase.String(k.phase)})
			base := metric.WithAttributes(kv...)
			o.ObserveFloat64(dev, v.deviation, base)
			o.ObserveInt64(state, v.state, base)
			a := int64(0)
			if v.alert {
				a = 1
			}
			o.ObserveInt64(strag, a, metric.WithAttributes(append(kv, KeyHint.String(v.hint))...))
		})
		return nil
	}, dev, strag, state)
	if err != nil {
		return nil, err
	}
	srcs := append([]selfmetrics.Source{e.selfSource(), ProcessSource()}, self...)
	if _, err := selfmetrics.Register(m, srcs...); err != nil {
		return nil, err
	}
	return in, nil
}

// selfSource reports the exporter's own counters under their
// selfmetrics keys (the keys of Counters).
func (e *Exporter) selfSource() selfmetrics.Source {
	return selfmetrics.Counters([]string{selfmetrics.Export}, e.Counters)
}

// Counters returns the exporter's counters under their selfmetrics keys
// (otel_spans_exported, otel_spans_dropped_REASON, ...): what the agent's
// status shows and the self-metrics export.
func (e *Exporter) Counters() map[string]int64 {
	st := e.Stats()
	m := map[string]int64{
		"otel_spans_exported":       st.SpansExported,
		"otel_metric_points_failed": st.MetricPointsFailed,
		"otel_export_errors":        st.ExportErrors,
		"otel_late_facts":           st.LateFacts,
		"otel_forced_settles":       st.ForcedSettles,
		"otel_buffered_steps":       int64(st.BufferedSteps),
	}
	for reason, n := range st.SpansDropped {
		m["otel_spans_dropped_"+reason] = n
	}
	for reason, n := range st.FactsDropped {
		m["otel_facts_dropped_"+reason] = n
	}
	return m
}

// ProcessSource reports the CPU time and resident set size of this
// process (/proc/self); without /proc it reports nothing.
func ProcessSource() selfmetrics.Source {
	fs, fsErr := procfs.NewFS("/proc")
	return selfmetrics.Source{Components: []string{selfmetrics.Process}, Observe: func(obs func(string, float64, ...string)) {
		if fsErr != nil {
			return
		}
		p, err := fs.Self()
		if err != nil {
			return
		}
		if s, err := p.Stat(); err == nil {
			obs("process_cpu_seconds", s.CPUTime())
			obs("process_rss_bytes", float64(s.ResidentMemory()))
		}
	}}
}

// opt returns the cached attribute option of (job, rank, phase) with the
// rank's placement labels; phase "" means no phase attribute.
func (in *instruments) opt(job string, rank int, phase string, labels rankLabels) metric.MeasurementOption {
	k := attrKey{job, rank, phase, labels}
	in.mu.Lock()
	o, ok := in.attrs[k]
	in.mu.Unlock()
	if ok {
		return o
	}
	kv := []attribute.KeyValue{AttrJob.String(job), KeyRank.Int(rank)}
	if phase != "" {
		kv = append(kv, KeyPhase.String(phase))
	}
	o = metric.WithAttributeSet(attribute.NewSet(labels.appendTo(kv)...))
	in.mu.Lock()
	if len(in.attrs) < maxCachedAttrSets {
		in.attrs[k] = o
	}
	in.mu.Unlock()
	return o
}

func (in *instruments) recordStep(s *detector.Step, labels rankLabels) {
	ctx := context.Background()
	stepMS, ok := s.Phases[detector.PhaseStep]
	if !ok && s.EndNS > s.StartNS {
		stepMS, ok = float64(s.EndNS-s.StartNS)/1e6, true
	}
	if ok {
		in.stepDur.Record(ctx, stepMS, in.opt(s.Job, s.Rank, "", labels))
	}
	for name, v := range s.Phases {
		if name != detector.PhaseStep {
			in.phaseDur.Record(ctx, v, in.opt(s.Job, s.Rank, name, labels))
		}
	}
}

func (in *instruments) recordVerdicts(vs []detector.Verdict) {
	ctx := context.Background()
	for i := range vs {
		in.verdicts.Add(ctx, 1, metric.WithAttributes(AttrJob.String(vs[i].Job), KeyState.String(vs[i].State), KeyPhase.String(vs[i].Phase)))
	}
}

// recordLatency records now - (end of the window's last step); without
// buffered facts the verdicts' window end stands in for it.
func (in *instruments) recordLatency(now, lastEnd int64, vs []detector.Verdict) {
	if len(vs) == 0 {
		return
	}
	if lastEnd <= 0 {
		for i := range vs {
			lastEnd = max(lastEnd, vs[i].WindowEndNS)
		}
	}
	if lastEnd <= 0 || now < lastEnd {
		return
	}
	in.latency.Record(context.Background(), float64(now-lastEnd)/1e9, metric.WithAttributes(AttrJob.String(vs[0].Job)))
}

type seriesKey struct {
	job   string
	rank  int
	phase string
}

type seriesVal struct {
	deviation float64
	state     int64
	alert     bool
	hint      string
}

const maxSeries = 1 << 16

// seriesState holds the latest verdict per (job, rank, phase) for the
// observable gauges. Bounded: beyond maxSeries new series are ignored.
type seriesState struct {
	mu      sync.Mutex
	m       map[seriesKey]*seriesVal
	ignored int64
}

func newSeriesState() *seriesState { return &seriesState{m: map[seriesKey]*seriesVal{}} }

// update applies one settled window's verdicts. Series of the same job that
// the window does not mention return to ok (the detector need not emit ok
// verdicts), except those holding an active alert, which only an explicit
// verdict ends.
func (s *seriesState) update(vs []detector.Verdict) {
	s.mu.Lock()
	defer s.mu.Unlock()
	seen := map[seriesKey]bool{}
	jobs := map[string]bool{}
	for i := range vs {
		v := &vs[i]
		k := seriesKey{v.Job, v.Rank, v.Phase}
		seen[k], jobs[v.Job] = true, true
		sv := s.m[k]
		if sv == nil {
			if len(s.m) >= maxSeries {
				s.ignored++
				continue
			}
			sv = &seriesVal{}
			s.m[k] = sv
		}
		sv.deviation, sv.state, sv.alert = v.Deviation, StateCode(v.State), alertActive(*v)
		if v.Hint != "" {
			sv.hint = v.Hint
		}
	}
	for k, sv := range s.m {
		if jobs[k.job] && !seen[k] && !sv.alert {
			sv.deviation, sv.state = 0, 0
		}
	}
}

func (s *seriesState) observe(f func(seriesKey, seriesVal)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, v := range s.m {
		f(k, *v)
	}
}

func (s *seriesState) forget(job string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k := range s.m {
		if k.job == job {
			delete(s.m, k)
		}
	}
}

// Export counts the data points of a failed export; the error itself goes
// to the PeriodicReader, which hands it to the error handler.
func (c *countingMetricExporter) Export(ctx context.Context, rm *metricdata.ResourceMetrics) error {
	err := c.Exporter.Export(ctx, rm)
	if err != nil {
		c.stats.metricsFailed.Add(int64(countPoints(rm)))
	}
	return err
}

func countPoints(rm *metricdata.ResourceMetrics) int {
	n := 0
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Gauge[int64]:
				n += len(d.DataPoints)
			case metricdata.Gauge[float64]:
				n += len(d.DataPoints)
			case metricdata.Sum[int64]:
				n += len(d.DataPoints)
			case metricdata.Sum[float64]:
				n += len(d.DataPoints)
			case metricdata.Histogram[int64]:
				n += len(d.DataPoints)
			case metricdata.Histogram[float64]:
				n += len(d.DataPoints)
			default:
				n++
			}
		}
	}
	return n
}
