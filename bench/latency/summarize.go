package main

import (
	"bufio"
	"compress/gzip"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

// openRaw opens dir/name or dir/name.gz.
func openRaw(dir, name string) (io.ReadCloser, error) {
	if f, err := os.Open(filepath.Join(dir, name)); err == nil {
		return f, nil
	}
	f, err := os.Open(filepath.Join(dir, name+".gz"))
	if err != nil {
		return nil, fmt.Errorf("open %s(.gz) in %s: %w", name, dir, err)
	}
	zr, err := gzip.NewReader(f)
	if err != nil {
		_ = f.Close() // read only
		return nil, fmt.Errorf("gunzip %s: %w", name, err)
	}
	return struct {
		io.Reader
		io.Closer
	}{zr, f}, nil
}

// readLines calls fn with every line of dir/name(.gz).
func readLines(dir, name string, fn func([]byte) error) error {
	rc, err := openRaw(dir, name)
	if err != nil {
		return err
	}
	defer rc.Close()
	sc := bufio.NewScanner(rc)
	sc.Buffer(make([]byte, 1<<20), 256<<20)
	for sc.Scan() {
		if len(sc.Bytes()) == 0 {
			continue
		}
		if err := fn(sc.Bytes()); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	return sc.Err()
}

// stats are the order statistics of a sample in seconds (nearest-rank
// percentiles: the ceil(q·n)-th smallest value).
type stats struct {
	N   int      `json:"n"`
	Min *float64 `json:"min_s"`
	P50 *float64 `json:"p50_s"`
	P95 *float64 `json:"p95_s"`
	Max *float64 `json:"max_s"`
}

func round3(v float64) *float64 { r := math.Round(v*1000) / 1000; return &r }

func summarizeSample(xs []float64) stats {
	s := stats{N: len(xs)}
	if len(xs) == 0 {
		return s
	}
	ys := append([]float64(nil), xs...)
	sort.Float64s(ys)
	q := func(p float64) float64 { return ys[max(0, int(math.Ceil(p*float64(len(ys))))-1)] }
	s.Min, s.P50, s.P95, s.Max = round3(ys[0]), round3(q(0.5)), round3(q(0.95)), round3(ys[len(ys)-1])
	return s
}

type jobSpec struct {
	Job          string  `json:"job"`
	Ranks        int     `json:"ranks"`
	SlowRank     *int    `json:"slow_rank"`
	SlowFromStep int64   `json:"slow_from_step"`
	SlowHostMS   float64 `json:"slow_host_ms"`
	Phase        string  `json:"phase"` // volume: healthy | anomalous
}

type truthDigest struct {
	Job    string         `json:"job"`
	Steps  map[string]int `json:"steps"`
	Slowed map[string]struct {
		Step    int64 `json:"step"`
		StartNS int64 `json:"start_ns"`
	} `json:"slowed"`
	Rank0EndNS []int64 `json:"rank0_end_ns"`
}

type alert struct {
	t          time.Time
	job, phase string
	rank       int
}

var (
	logTime  = regexp.MustCompile(`^time=(\S+)`)
	logField = regexp.MustCompile(` (job|rank|phase)=("(?:[^"\\]|\\.)*"|\S+)`)
)

// parseAlerts returns the agent log's STRAGGLER lines in order.
func parseAlerts(dir string) ([]alert, error) {
	var out []alert
	err := readLines(dir, "agent.log", func(b []byte) error {
		line := string(b)
		if !strings.Contains(line, " msg=STRAGGLER ") {
			return nil
		}
		m := logTime.FindStringSubmatch(line)
		if m == nil {
			return nil
		}
		t, err := time.Parse(time.RFC3339Nano, m[1])
		if err != nil {
			return nil
		}
		a := alert{t: t}
		for _, f := range logField.FindAllStringSubmatch(line, -1) {
			v := strings.Trim(f[2], `"`)
			switch f[1] {
			case "job":
				a.job = v
			case "rank":
				a.rank, _ = strconv.Atoi(v)
			case "phase":
				a.phase = v
			}
		}
		out = append(out, a)
		return nil
	})
	return out, err
}

// raw is what a run left in its raw directory.
type raw struct {
	config  map[string]any
	jobs    []jobSpec
	truth   map[string]truthDigest
	alerts  []alert
	offset  int64 // wall − mono, ns (median of the probe's clock lines)
	reqs    []reqLine
	jaeger  []jaegerLine
	prom    []promLine
	totals  json.RawMessage
	skipped int
	timeout int
}

type jaegerLine struct {
	Job       string `json:"job"`
	Step      int64  `json:"step"`
	StepEndNS int64  `json:"step_end_ns"`
	SeenNS    int64  `json:"seen_ns"`
}

type promLine struct {
	Job    string `json:"job"`
	Rank   int    `json:"rank"`
	Phase  string `json:"phase"`
	SeenNS int64  `json:"seen_ns"`
}

func readRaw(dir string) (*raw, error) {
	r := &raw{truth: map[string]truthDigest{}}
	rc, err := openRaw(dir, "config.json")
	if err != nil {
		return nil, err
	}
	err = json.NewDecoder(rc).Decode(&r.config)
	rc.Close()
	if err != nil {
		return nil, fmt.Errorf("config.json: %w", err)
	}
	if err := readLines(dir, "jobs.jsonl", func(b []byte) error {
		var j jobSpec
		if err := json.Unmarshal(b, &j); err != nil {
			return err
		}
		r.jobs = append(r.jobs, j)
		return nil
	}); err != nil {
		return nil, err
	}
	if err := readLines(dir, "truth.jsonl", func(b []byte) error {
		var t truthDigest
		if err := json.Unmarshal(b, &t); err != nil {
			return err
		}
		r.truth[t.Job] = t
		return nil
	}); err != nil {
		return nil, err
	}
	if r.alerts, err = parseAlerts(dir); err != nil {
		return nil, err
	}
	var offsets []int64
	err = readLines(dir, "probe.jsonl", func(b []byte) error {
		var k struct {
			Kind   string          `json:"kind"`
			WallNS int64           `json:"wall_ns"`
			MonoNS int64           `json:"mono_ns"`
			Totals json.RawMessage `json:"totals"`
			Skip   int             `json:"jaeger_skipped"`
			TO     int             `json:"jaeger_timeouts"`
		}
		if err := json.Unmarshal(b, &k); err != nil {
			return err
		}
		switch k.Kind {
		case "clock":
			offsets = append(offsets, k.WallNS-k.MonoNS)
		case "req":
			var q reqLine
			if err := json.Unmarshal(b, &q); err != nil {
				return err
			}
			r.reqs = append(r.reqs, q)
		case "jaeger":
			var j jaegerLine
			if err := json.Unmarshal(b, &j); err != nil {
				return err
			}
			r.jaeger = append(r.jaeger, j)
		case "prom":
			var p promLine
			if err := json.Unmarshal(b, &p); err != nil {
				return err
			}
			r.prom = append(r.prom, p)
		case "totals":
			r.totals, r.skipped, r.timeout = k.Totals, k.Skip, k.TO
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(offsets) == 0 {
		return nil, errors.New("probe.jsonl has no clock line")
	}
	sort.Slice(offsets, func(i, j int) bool { return offsets[i] < offsets[j] })
	r.offset = offsets[len(offsets)/2]
	return r, nil
}

func sec(d int64) float64 { return float64(d) / 1e9 }

type jobLatency struct {
	Job               string   `json:"job"`
	SlowRank          int      `json:"slow_rank"`
	SlowFromStep      int64    `json:"slow_from_step"`
	SlowdownToVerdict *float64 `json:"slowdown_to_verdict_s"`
	VerdictPhase      string   `json:"verdict_phase,omitempty"`
	VerdictToProm     *float64 `json:"verdict_to_prometheus_s"`
	VerdictToColl     *float64 `json:"verdict_to_collector_s"`
	OtherAlerts       int      `json:"other_alerts"` // STRAGGLER lines of this job for another rank
}

func summarizeMain(args []string) error {
	fs := flag.NewFlagSet("summarize", flag.ExitOnError)
	dir := fs.String("raw", "bench/results/raw/latency", "raw directory of a run.sh run")
	out := fs.String("out", "bench/results/latency.json", "summary written here")
	if err := fs.Parse(args); err != nil {
		return err
	}
	r, err := readRaw(*dir)
	if err != nil {
		return err
	}
	return writeSummary(*out, latencySummary(r))
}

// writeSummary prints v as indented JSON and writes it to path.
func writeSummary(path string, v any) error {
	b, err := json.MarshalIndent(v, "", " ")
	if err != nil {
		return err
	}
	b = append(b, '\n')
	if _, err := os.Stdout.Write(b); err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

func latencySummary(r *raw) map[string]any {
	// The first collector receipt of each (job, rank) straggler point, and
	// of each (job, step) with every rank's train.step span.
	collStraggler := map[[2]string]int64{}
	type stepKey struct {
		job  string
		step int64
	}
	endOf := map[stepKey]int64{}
	complete := map[stepKey]int64{}
	for _, q := range r.reqs {
		for _, s := range q.Straggler {
			k := [2]string{s.Job, strconv.Itoa(s.Rank)}
			if _, ok := collStraggler[k]; !ok {
				collStraggler[k] = q.TNS
			}
		}
		for _, s := range q.Steps {
			if s.Step < 0 || len(s.Ranks) == 0 {
				continue
			}
			k := stepKey{s.Job, s.Step}
			endOf[k] = max(endOf[k], s.EndNS)
			complete[k] = q.TNS // the last rank's spans arrived (requests are in receipt order)

		}
	}
	promAt := map[[2]string]int64{}
	for _, p := range r.prom {
		k := [2]string{p.Job, strconv.Itoa(p.Rank)}
		if t, ok := promAt[k]; !ok || p.SeenNS < t {
			promAt[k] = p.SeenNS
		}
	}
	var s2v, v2p, v2c, s2p []float64
	var rows []jobLatency
	missed := 0
	falseAlerts := 0
	slowedStep := map[string]struct {
		rank int
		from int64
	}{}
	for _, j := range r.jobs {
		if j.SlowRank == nil {
			continue
		}
		row := jobLatency{Job: j.Job, SlowRank: *j.SlowRank, SlowFromStep: j.SlowFromStep}
		slowedStep[j.Job] = struct {
			rank int
			from int64
		}{*j.SlowRank, j.SlowFromStep}
		var first *alert
		for i := range r.alerts {
			a := &r.alerts[i]
			if a.job != j.Job {
				continue
			}
			if a.rank != *j.SlowRank {
				row.OtherAlerts++
				continue
			}
			if first == nil {
				first = a
			}
		}
		falseAlerts += row.OtherAlerts
		td, ok := r.truth[j.Job]
		sl, slok := td.Slowed[strconv.Itoa(*j.SlowRank)]
		if first == nil || !ok || !slok {
			missed++
			rows = append(rows, row)
			continue
		}
		start := sl.StartNS + r.offset
		v := first.t.UnixNano()
		row.SlowdownToVerdict = round3(sec(v - start))
		row.VerdictPhase = first.phase
		s2v = append(s2v, sec(v-start))
		k := [2]string{j.Job, strconv.Itoa(*j.SlowRank)}
		if t, ok := promAt[k]; ok {
			row.VerdictToProm = round3(sec(t - v))
			v2p = append(v2p, sec(t-v))
			s2p = append(s2p, sec(t-start))
		}
		if t, ok := collStraggler[k]; ok {
			row.VerdictToColl = round3(sec(t - v))
			v2c = append(v2c, sec(t-v))
		}
		rows = append(rows, row)
	}
	var jAll, jBase, jSlow, cAll []float64
	for _, jl := range r.jaeger {
		d := sec(jl.SeenNS - jl.StepEndNS)
		jAll = append(jAll, d)
		if ss, ok := slowedStep[jl.Job]; ok && jl.Step >= ss.from {
			jSlow = append(jSlow, d)
		} else {
			jBase = append(jBase, d)
		}
	}
	for k, t := range complete {
		cAll = append(cAll, sec(t-endOf[k]))
	}
	coll, _ := r.config["collector"].(string)
	res := map[string]any{
		"what": "end-to-end latency of slowrank's output on the fake job (bench/latency/run.sh): real agent, real uprobes, " +
			"OTLP/HTTP through a recording proxy to the OpenTelemetry Collector (deploy/otelcol.yaml) and Jaeger v2",
		"config":                     r.config,
		"percentiles":                "nearest rank: the ceil(q*n)-th smallest value",
		"slowdown_to_verdict":        summarizeSample(s2v),
		"step_end_to_collector":      summarizeSample(cAll),
		"step_end_to_jaeger":         summarizeSample(jAll),
		"step_end_to_jaeger_split":   map[string]stats{"before_slowdown": summarizeSample(jBase), "slowed_steps": summarizeSample(jSlow)},
		"verdict_to_prometheus":      summarizeSample(v2p),
		"slowdown_to_prometheus":     summarizeSample(s2p),
		"verdict_to_collector":       summarizeSample(v2c),
		"jobs_with_slowdown":         len(rows),
		"jobs_missed":                missed,
		"alerts_on_other_ranks":      falseAlerts,
		"jaeger_traces_not_followed": r.skipped,
		"jaeger_traces_timed_out":    r.timeout,
		"jobs":                       rows,
	}
	if coll == "mini" {
		res["step_end_to_jaeger"] = nil
		res["step_end_to_jaeger_split"] = nil
		res["verdict_to_prometheus"] = nil
		res["slowdown_to_prometheus"] = nil
		res["what"] = "end-to-end latency of slowrank's output on the fake job (bench/latency/run.sh): real agent, real uprobes, " +
			"OTLP/HTTP through a recording proxy to otelcol-mini"
		res["note"] = "collector otelcol-mini (OTLP in, debug out): no Jaeger and no Prometheus exporter; collector receipt is the probe's"
	}
	return res
}

// volumeMain writes bytes exported per GPU per step, healthy and anomalous.
func volumeMain(args []string) error {
	fs := flag.NewFlagSet("volume", flag.ExitOnError)
	dir := fs.String("raw", "bench/results/raw/volume", "raw directory of a bench/volume/run.sh run")
	out := fs.String("out", "bench/results/volume.json", "summary written here")
	if err := fs.Parse(args); err != nil {
		return err
	}
	r, err := readRaw(*dir)
	if err != nil {
		return err
	}
	sum, err := volumeSummary(r)
	if err != nil {
		return err
	}
	return writeSummary(*out, sum)
}

type period struct {
	From, To int64 // Unix ns
}

func (p period) has(t int64) bool { return t >= p.From && t <= p.To }

type perGPUStep struct {
	Spans        float64 `json:"spans"`
	JobMetrics   float64 `json:"job_metrics"`
	AgentMetrics float64 `json:"agent_metrics"` // the agent's own series, shared by the host's GPUs
	Facts        float64 `json:"forwarded_facts"`
	Total        float64 `json:"total"`
	TotalGzip    float64 `json:"total_if_gzip"` // the same requests gzip'ed (OTEL_EXPORTER_OTLP_COMPRESSION=gzip)
}

func r1(v float64) float64 { return math.Round(v*10) / 10 }

func volumeSummary(r *raw) (map[string]any, error) {
	var tot struct {
		SpanNames  map[string]map[string]sized `json:"span_names"`
		SpanAttrs  map[string]map[string]sized `json:"span_attrs"`
		SpanParts  map[string]map[string]sized `json:"span_parts"`
		MetricName map[string]map[string]sized `json:"metric_name"`
		MetricAttr map[string]map[string]sized `json:"metric_attr"`
		LogAttrs   map[string]map[string]sized `json:"log_attrs"`
		Envelope   map[string]sized            `json:"envelope"`
	}
	if len(r.totals) > 0 {
		if err := json.Unmarshal(r.totals, &tot); err != nil {
			return nil, fmt.Errorf("totals: %w", err)
		}
	}
	interval := 5.0
	if v, ok := r.config["metric_interval_s"].(float64); ok && v > 0 {
		interval = v
	}
	out := map[string]any{
		"what": "bytes exported per GPU (rank) per step: OTLP/HTTP request bodies (protobuf, uncompressed as the agent sends them) " +
			"counted by a recording proxy between the agent and the collector; spans and forwarded facts attributed to (job, step) " +
			"by their attributes, metric data points to their job (the agent's own series to the host)",
		"config":  r.config,
		"target":  "<= 1024 bytes per GPU per step, healthy",
		"method":  "each request's envelope (resource, scope, framing) is shared among its items in proportion to their sizes",
		"periods": map[string]string{"healthy": "the healthy job from its first step end + 10 s to its last", "anomalous": "the anomalous job from its first STRAGGLER verdict to its last step end"},
	}
	jobsOut := map[string]any{}
	for _, j := range r.jobs {
		td, ok := r.truth[j.Job]
		if !ok || len(td.Rank0EndNS) < 10 {
			return nil, fmt.Errorf("no truth for job %s", j.Job)
		}
		ends := td.Rank0EndNS
		first, last := ends[0]+r.offset, ends[len(ends)-1]+r.offset
		var pd period
		switch j.Phase {
		case "healthy":
			pd = period{first + 10e9, last}
		case "anomalous":
			pd = period{-1, last}
			for _, a := range r.alerts {
				if a.job == j.Job && (j.SlowRank == nil || a.rank == *j.SlowRank) {
					pd.From = a.t.UnixNano()
					break
				}
			}
			if pd.From < 0 {
				jobsOut[j.Job] = map[string]any{"phase": j.Phase, "error": "no STRAGGLER verdict: no anomalous period"}
				continue
			}
		default:
			continue
		}
		// Steps (rank 0's numbering: index in the sorted ends) inside the period.
		inSteps := map[int64]bool{}
		for k, e := range ends {
			if pd.has(e + r.offset) {
				inSteps[int64(k)] = true
			}
		}
		n := float64(len(inSteps))
		ranks := float64(j.Ranks)
		var v, vz perGPUStep
		keptSteps := map[int64]bool{}
		spanCount := 0
		var metricReqs, logRecs int
		var metricJobBytes, agentBytes float64
		hostRanks := ranks // one job at a time on this host
		for _, q := range r.reqs {
			zr := 1.0
			if q.ProtoBytes > 0 {
				zr = float64(q.GzipBytes) / float64(q.ProtoBytes)
			}
			switch q.Signal {
			case "traces":
				for _, s := range q.Steps {
					if s.Job == j.Job && inSteps[s.Step] {
						v.Spans += float64(s.Bytes)
						vz.Spans += float64(s.Bytes) * zr
						keptSteps[s.Step] = true
						spanCount += s.Spans
					}
				}
			case "metrics":
				if !pd.has(q.TNS) {
					continue
				}
				metricReqs++
				if jb := q.Jobs[j.Job]; jb != nil {
					v.JobMetrics += float64(jb.Bytes)
					vz.JobMetrics += float64(jb.Bytes) * zr
					metricJobBytes += float64(jb.Bytes)
				}
				if jb := q.Jobs[""]; jb != nil {
					v.AgentMetrics += float64(jb.Bytes) / hostRanks * ranks
					vz.AgentMetrics += float64(jb.Bytes) * zr / hostRanks * ranks
					agentBytes += float64(jb.Bytes)
				}
			case "logs":
				if !pd.has(q.TNS) {
					continue
				}
				if jb := q.Jobs[j.Job]; jb != nil {
					v.Facts += float64(jb.Bytes)
					vz.Facts += float64(jb.Bytes) * zr
					logRecs += jb.Records
				}
			}
		}
		norm := func(p *perGPUStep) {
			p.Spans, p.JobMetrics, p.AgentMetrics, p.Facts = r1(p.Spans/(ranks*n)), r1(p.JobMetrics/(ranks*n)), r1(p.AgentMetrics/(ranks*n)), r1(p.Facts/(ranks*n))
			p.Total = r1(p.Spans + p.JobMetrics + p.AgentMetrics + p.Facts)
		}
		norm(&v)
		norm(&vz)
		v.TotalGzip = vz.Total
		durS := float64(pd.To-pd.From) / 1e9
		row := map[string]any{
			"phase": j.Phase, "ranks": j.Ranks, "period_s": r1(durS), "steps_in_period": int(n),
			"step_ms": r1(durS * 1000 / n), "bytes_per_gpu_step": v,
			"spans": map[string]any{"steps_with_spans": len(keptSteps), "spans": spanCount,
				"spans_per_gpu_step": r1(float64(spanCount) / (ranks * n))},
			"metrics": map[string]any{"exports": metricReqs,
				"job_bytes_per_gpu_per_export":       r1(metricJobBytes / ranks / math.Max(1, float64(metricReqs))),
				"agent_bytes_per_host_per_export":    r1(agentBytes / math.Max(1, float64(metricReqs))),
				"metric_interval_s":                  interval,
				"job_bytes_per_gpu_step_at_1_step_s": r1(metricJobBytes / ranks / math.Max(1, float64(metricReqs)) / interval)},
			"forwarded_facts": map[string]any{"records": logRecs},
		}
		// What the bytes are, over the whole job (spans by part, attribute
		// and name; metric points by name), per GPU-step of the job.
		all := 0.0
		for _, c := range td.Steps {
			all += float64(c)
		}
		perJob := func(m map[string]sized, top int) []map[string]any {
			type kv struct {
				k string
				s sized
			}
			var xs []kv
			for k, s := range m {
				xs = append(xs, kv{k, s})
			}
			sort.Slice(xs, func(a, b int) bool {
				return xs[a].s.Bytes > xs[b].s.Bytes || xs[a].s.Bytes == xs[b].s.Bytes && xs[a].k < xs[b].k
			})
			var o []map[string]any
			for i, x := range xs {
				if i >= top {
					break
				}
				o = append(o, map[string]any{"key": x.k, "n": x.s.N, "bytes": x.s.Bytes, "bytes_per_gpu_step": r1(float64(x.s.Bytes) / all)})
			}
			return o
		}
		row["breakdown_whole_job"] = map[string]any{
			"gpu_steps":         int(all),
			"span_parts":        perJob(tot.SpanParts[j.Job], 10),
			"span_names":        perJob(tot.SpanNames[j.Job], 12),
			"span_attributes":   perJob(tot.SpanAttrs[j.Job], 15),
			"metric_names":      perJob(tot.MetricName[j.Job], 12),
			"metric_attributes": perJob(tot.MetricAttr[j.Job], 8),
			"fact_attributes":   perJob(tot.LogAttrs[j.Job], 12),
		}
		// Series of a finished job still exported 30 s after its end.
		stale, staleN := 0, 0
		for _, q := range r.reqs {
			if q.Signal == "metrics" && q.TNS > last+30e9 {
				staleN++
				if jb := q.Jobs[j.Job]; jb != nil {
					stale += jb.Bytes
				}
			}
		}
		// Metrics are per export, not per step: the same job at other step
		// times, on a host of 8 GPUs (the agent's own series shared by 8).
		perExportGPU := metricJobBytes / ranks / math.Max(1, float64(metricReqs))
		perExportHost := agentBytes / math.Max(1, float64(metricReqs))
		var proj []map[string]any
		for _, stepS := range []float64{0.1, 0.5, 1, 2, 5} {
			m := (perExportGPU + perExportHost/8) * stepS / interval
			proj = append(proj, map[string]any{"step_s": stepS, "metrics": r1(m),
				"total": r1(v.Spans + v.Facts + m), "total_without_aggregator": r1(v.Spans + m)})
		}
		row["projection_8_gpus_per_host"] = proj
		row["metrics_after_job_end_30s"] = map[string]any{"exports": staleN, "job_bytes": stale}
		jobsOut[j.Job] = row
	}
	out["jobs"] = jobsOut
	out["agent_metric_names"] = func() []map[string]any {
		var o []map[string]any
		for k, s := range tot.MetricName[""] {
			o = append(o, map[string]any{"key": k, "n": s.N, "bytes": s.Bytes})
		}
		sort.Slice(o, func(a, b int) bool { return o[a]["bytes"].(int) > o[b]["bytes"].(int) })
		return o
	}()
	out["envelope"] = tot.Envelope
	return out, nil
}
