package main

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/slowrank/slowrank/internal/monoclock"
	collogs "go.opentelemetry.io/proto/otlp/collector/logs/v1"
	colmetrics "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	metricspb "go.opentelemetry.io/proto/otlp/metrics/v1"
	"google.golang.org/protobuf/proto"
)

// maxBody bounds one request body (the agent's batches are far smaller).
const maxBody = 64 << 20

// recorder writes JSON lines, one writer for every goroutine.
type recorder struct {
	mu  sync.Mutex
	w   *bufio.Writer
	err error // the first line that could not be marshalled
}

// write appends v as a line. A write error stays in the bufio.Writer, which
// then refuses everything: flush returns it, with the first line that could
// not be marshalled, so a run with a hole fails instead of summarising it.
func (r *recorder) write(v any) {
	b, err := json.Marshal(v)
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		if r.err == nil {
			r.err = fmt.Errorf("marshal a probe line: %w", err)
		}
		return
	}
	_, _ = r.w.Write(b)
	_ = r.w.WriteByte('\n')
}

func (r *recorder) flush() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return errors.Join(r.err, r.w.Flush())
}

// stepBytes is what one traces request carried of one (job, step).
type stepBytes struct {
	Job   string `json:"job"`
	Step  int64  `json:"step"`
	Trace string `json:"trace"`
	Spans int    `json:"spans"`
	Ranks []int  `json:"ranks"`
	Bytes int    `json:"bytes"`
	EndNS int64  `json:"end_ns"` // latest span end, Unix ns
}

// jobBytes is what one metrics or logs request carried of one job ("" for
// the agent's own metrics).
type jobBytes struct {
	Records int `json:"records"` // data points or log records
	Bytes   int `json:"bytes"`
}

// jobItem is one data point or log record of a job and its encoded size.
type jobItem struct {
	job  string
	size int
}

// addJobs spreads a request's total bytes over its jobs in proportion to
// their records' sizes (sum of them).
func (l *reqLine) addJobs(items []jobItem, sum, total int) {
	for _, it := range items {
		jb := l.Jobs[it.job]
		if jb == nil {
			jb = &jobBytes{}
			l.Jobs[it.job] = jb
		}
		jb.Records++
		jb.Bytes += share(it.size, sum, total)
	}
}

type stragglerPoint struct {
	Job   string `json:"job"`
	Rank  int    `json:"rank"`
	Phase string `json:"phase"`
}

type reqLine struct {
	Kind       string               `json:"kind"` // "req"
	TNS        int64                `json:"t_ns"` // Unix ns at receipt
	Signal     string               `json:"signal"`
	Encoding   string               `json:"encoding,omitempty"`
	WireBytes  int                  `json:"wire_bytes"`
	ProtoBytes int                  `json:"proto_bytes"`
	GzipBytes  int                  `json:"gzip_bytes"` // the body gzip'ed (level 6): what compression would send
	Status     int                  `json:"status"`
	Error      string               `json:"error,omitempty"`
	Steps      []stepBytes          `json:"steps,omitempty"`
	Jobs       map[string]*jobBytes `json:"jobs,omitempty"`
	Straggler  []stragglerPoint     `json:"straggler,omitempty"`
}

// sized is a name with a count and bytes, for the totals line.
type sized struct {
	N     int `json:"n"`
	Bytes int `json:"bytes"`
}

// envelope adds one request's bytes outside its records (the caller holds
// t.mu).
func (t *totals) envelope(signal string, bytes int) {
	env := t.Envelope[signal]
	if env == nil {
		env = &sized{}
		t.Envelope[signal] = env
	}
	env.N++
	env.Bytes += bytes
}

// totals are the run's bytes by what they carry, per job.
type totals struct {
	mu         sync.Mutex
	SpanNames  map[string]map[string]*sized `json:"span_names"`  // job → span name
	SpanAttrs  map[string]map[string]*sized `json:"span_attrs"`  // job → attribute key (KeyValue bytes)
	SpanParts  map[string]map[string]*sized `json:"span_parts"`  // job → ids_times_name, attributes, events, status
	MetricName map[string]map[string]*sized `json:"metric_name"` // job → metric name (data point bytes)
	MetricAttr map[string]map[string]*sized `json:"metric_attr"` // job → data point attribute key
	LogAttrs   map[string]map[string]*sized `json:"log_attrs"`   // job → attribute key
	Envelope   map[string]*sized            `json:"envelope"`    // signal → bytes outside spans, points, records
}

func newTotals() *totals {
	return &totals{
		SpanNames: map[string]map[string]*sized{}, SpanAttrs: map[string]map[string]*sized{},
		SpanParts: map[string]map[string]*sized{}, MetricName: map[string]map[string]*sized{},
		MetricAttr: map[string]map[string]*sized{}, LogAttrs: map[string]map[string]*sized{},
		Envelope: map[string]*sized{},
	}
}

func add(m map[string]map[string]*sized, job, key string, bytes int) {
	inner := m[job]
	if inner == nil {
		inner = map[string]*sized{}
		m[job] = inner
	}
	s := inner[key]
	if s == nil {
		s = &sized{}
		inner[key] = s
	}
	s.N++
	s.Bytes += bytes
}

func attrString(kvs []*commonpb.KeyValue, key string) string {
	for _, kv := range kvs {
		if kv.GetKey() == key {
			v := kv.GetValue()
			if s, ok := v.GetValue().(*commonpb.AnyValue_StringValue); ok {
				return s.StringValue
			}
			if i, ok := v.GetValue().(*commonpb.AnyValue_IntValue); ok {
				return strconv.FormatInt(i.IntValue, 10)
			}
		}
	}
	return ""
}

func attrInt(kvs []*commonpb.KeyValue, key string) (int64, bool) {
	for _, kv := range kvs {
		if kv.GetKey() == key {
			switch v := kv.GetValue().GetValue().(type) {
			case *commonpb.AnyValue_IntValue:
				return v.IntValue, true
			case *commonpb.AnyValue_StringValue:
				n, err := strconv.ParseInt(v.StringValue, 10, 64)
				return n, err == nil
			}
		}
	}
	return 0, false
}

// newTrace is a trace the proxy saw, for the Jaeger watcher.
type newTrace struct {
	id, job string
	step    int64
	ranks   []int // ranks of the train.step spans of this trace in the request
}

type probe struct {
	upstream, logsUpstream string
	client                 *http.Client
	rec                    *recorder
	tot                    *totals
	traces                 chan newTrace
	followEvery            int
	traceOf                map[string]traceKey // trace id → its train.step's (job, step); under tot.mu
}

type traceKey struct {
	job  string
	step int64
}

func (p *probe) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	t := time.Now()
	signal := strings.TrimPrefix(r.URL.Path, "/v1/")
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody))
	if err != nil {
		http.Error(w, "read body: "+err.Error(), http.StatusBadRequest)
		return
	}
	line := reqLine{Kind: "req", TNS: t.UnixNano(), Signal: signal, Encoding: r.Header.Get("Content-Encoding"), WireBytes: len(body)}
	raw := body
	if line.Encoding == "gzip" {
		zr, err := gzip.NewReader(bytes.NewReader(body))
		if err == nil {
			raw, err = io.ReadAll(io.LimitReader(zr, maxBody))
		}
		if err != nil {
			line.Error = "gunzip: " + err.Error()
		}
	}
	line.ProtoBytes = len(raw)
	line.GzipBytes = len(body)
	if line.Encoding != "gzip" {
		line.GzipBytes = gzipSize(raw)
	}
	if line.Error == "" {
		if err := p.decode(&line, raw); err != nil {
			line.Error = err.Error()
		}
	}
	// Forward unchanged.
	up := p.upstream
	if signal == "logs" && p.logsUpstream != "" {
		up = p.logsUpstream
	}
	if signal == "logs" && p.logsUpstream == "" || up == "" {
		line.Status = http.StatusOK
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.WriteHeader(http.StatusOK)
		p.rec.write(line)
		return
	}
	req, err := http.NewRequestWithContext(r.Context(), http.MethodPost, up+r.URL.Path, bytes.NewReader(body))
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	for _, h := range []string{"Content-Type", "Content-Encoding", "Authorization"} {
		if v := r.Header.Get(h); v != "" {
			req.Header.Set(h, v)
		}
	}
	resp, err := p.client.Do(req)
	if err != nil {
		line.Status = http.StatusBadGateway
		line.Error = "upstream: " + err.Error()
		p.rec.write(line)
		http.Error(w, "upstream: "+err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	rb, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	line.Status = resp.StatusCode
	p.rec.write(line)
	if ct := resp.Header.Get("Content-Type"); ct != "" {
		w.Header().Set("Content-Type", ct)
	}
	w.WriteHeader(resp.StatusCode)
	w.Write(rb)
}

func gzipSize(b []byte) int {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	// Into a buffer: neither can fail.
	_, _ = zw.Write(b)
	_ = zw.Close()
	return buf.Len()
}

// share spreads a request's envelope (resource, scope, framing) over its
// items in proportion to their own sizes: item bytes × total / sum.
func share(item, sum, total int) int {
	if sum == 0 {
		return 0
	}
	return int(float64(item) * float64(total) / float64(sum))
}

func (p *probe) decode(line *reqLine, raw []byte) error {
	switch line.Signal {
	case "traces":
		var req coltrace.ExportTraceServiceRequest
		if err := proto.Unmarshal(raw, &req); err != nil {
			return fmt.Errorf("traces: %w", err)
		}
		type key struct {
			job  string
			step int64
		}
		by := map[key]*stepBytes{}
		var order []key
		sum := 0
		type item struct {
			k    key
			size int
		}
		var items []item
		p.tot.mu.Lock()
		// Phase children carry neither job nor step: they take their
		// train.step parent's, found by trace id (this request or an
		// earlier one).
		for _, rs := range req.GetResourceSpans() {
			for _, ss := range rs.GetScopeSpans() {
				for _, sp := range ss.GetSpans() {
					job := attrString(sp.GetAttributes(), "slowrank.job.id")
					if step, ok := attrInt(sp.GetAttributes(), "slowrank.step"); ok && job != "" {
						if len(p.traceOf) > 1<<20 {
							p.traceOf = map[string]traceKey{}
						}
						p.traceOf[string(sp.GetTraceId())] = traceKey{job, step}
					}
				}
			}
		}
		for _, rs := range req.GetResourceSpans() {
			rjob := attrString(rs.GetResource().GetAttributes(), "slowrank.job.id")
			for _, ss := range rs.GetScopeSpans() {
				for _, sp := range ss.GetSpans() {
					job := attrString(sp.GetAttributes(), "slowrank.job.id")
					step, ok := attrInt(sp.GetAttributes(), "slowrank.step")
					if tk, found := p.traceOf[string(sp.GetTraceId())]; found && (job == "" || !ok) {
						job, step, ok = tk.job, tk.step, true
					}
					if job == "" {
						job = rjob
					}
					if !ok {
						step = -1
					}
					size := proto.Size(sp)
					sum += size
					k := key{job, step}
					sb := by[k]
					if sb == nil {
						sb = &stepBytes{Job: job, Step: step, Trace: hex.EncodeToString(sp.GetTraceId())}
						by[k] = sb
						order = append(order, k)
					}
					sb.Spans++
					if end := int64(sp.GetEndTimeUnixNano()); end > sb.EndNS {
						sb.EndNS = end
					}
					if sp.GetName() == "train.step" {
						if r, ok := attrInt(sp.GetAttributes(), "slowrank.rank"); ok {
							sb.Ranks = append(sb.Ranks, int(r))
						}
					}
					items = append(items, item{k, size})
					add(p.tot.SpanNames, job, sp.GetName(), size)
					attrs := 0
					for _, kv := range sp.GetAttributes() {
						n := proto.Size(kv) + 2
						attrs += n
						add(p.tot.SpanAttrs, job, kv.GetKey(), n)
					}
					events := 0
					for _, ev := range sp.GetEvents() {
						events += proto.Size(ev) + 2
					}
					status := 0
					if sp.GetStatus() != nil {
						status = proto.Size(sp.GetStatus()) + 2
					}
					add(p.tot.SpanParts, job, "attributes", attrs)
					add(p.tot.SpanParts, job, "events", events)
					add(p.tot.SpanParts, job, "status", status)
					add(p.tot.SpanParts, job, "ids_times_name_kind", size-attrs-events-status)
				}
			}
		}
		p.tot.envelope("traces", len(raw)-sum)
		p.tot.mu.Unlock()
		for _, it := range items {
			by[it.k].Bytes += share(it.size, sum, len(raw))
		}
		for _, k := range order {
			sb := by[k]
			sort.Ints(sb.Ranks)
			line.Steps = append(line.Steps, *sb)
			if k.step >= 0 && p.traces != nil && len(sb.Ranks) > 0 && followed(sb.Trace, p.followEvery) {
				select {
				case p.traces <- newTrace{sb.Trace, sb.Job, sb.Step, sb.Ranks}:
				default: // the watcher is behind: not followed (counted there as skipped if new)
				}
			}
		}
	case "metrics":
		var req colmetrics.ExportMetricsServiceRequest
		if err := proto.Unmarshal(raw, &req); err != nil {
			return fmt.Errorf("metrics: %w", err)
		}
		line.Jobs = map[string]*jobBytes{}
		var items []jobItem
		sum := 0
		p.tot.mu.Lock()
		point := func(name string, attrs []*commonpb.KeyValue, size int) {
			job := attrString(attrs, "slowrank.job.id")
			items = append(items, jobItem{job, size})
			sum += size
			add(p.tot.MetricName, job, name, size)
			for _, kv := range attrs {
				add(p.tot.MetricAttr, job, kv.GetKey(), proto.Size(kv)+2)
			}
		}
		for _, rm := range req.GetResourceMetrics() {
			for _, sm := range rm.GetScopeMetrics() {
				for _, m := range sm.GetMetrics() {
					switch d := m.GetData().(type) {
					case *metricspb.Metric_Gauge:
						for _, dp := range d.Gauge.GetDataPoints() {
							point(m.GetName(), dp.GetAttributes(), proto.Size(dp)+2)
							if m.GetName() == "slowrank.straggler" && numberValue(dp) == 1 {
								r, _ := attrInt(dp.GetAttributes(), "rank")
								line.Straggler = append(line.Straggler, stragglerPoint{
									Job: attrString(dp.GetAttributes(), "slowrank.job.id"), Rank: int(r),
									Phase: attrString(dp.GetAttributes(), "phase"),
								})
							}
						}
					case *metricspb.Metric_Sum:
						for _, dp := range d.Sum.GetDataPoints() {
							point(m.GetName(), dp.GetAttributes(), proto.Size(dp)+2)
						}
					case *metricspb.Metric_Histogram:
						for _, dp := range d.Histogram.GetDataPoints() {
							point(m.GetName(), dp.GetAttributes(), proto.Size(dp)+2)
						}
					case *metricspb.Metric_ExponentialHistogram:
						for _, dp := range d.ExponentialHistogram.GetDataPoints() {
							point(m.GetName(), dp.GetAttributes(), proto.Size(dp)+2)
						}
					}
				}
			}
		}
		p.tot.envelope("metrics", len(raw)-sum)
		p.tot.mu.Unlock()
		line.addJobs(items, sum, len(raw))
	case "logs":
		var req collogs.ExportLogsServiceRequest
		if err := proto.Unmarshal(raw, &req); err != nil {
			return fmt.Errorf("logs: %w", err)
		}
		line.Jobs = map[string]*jobBytes{}
		var items []jobItem
		sum := 0
		p.tot.mu.Lock()
		for _, rl := range req.GetResourceLogs() {
			job := attrString(rl.GetResource().GetAttributes(), "slowrank.job.id")
			for _, sl := range rl.GetScopeLogs() {
				for _, lr := range sl.GetLogRecords() {
					size := proto.Size(lr) + 2
					sum += size
					items = append(items, jobItem{job, size})
					for _, kv := range lr.GetAttributes() {
						add(p.tot.LogAttrs, job, kv.GetKey(), proto.Size(kv)+2)
					}
					if lr.GetBody() != nil {
						add(p.tot.LogAttrs, job, "(body)", proto.Size(lr.GetBody())+2)
					}
				}
			}
		}
		p.tot.envelope("logs", len(raw)-sum)
		p.tot.mu.Unlock()
		line.addJobs(items, sum, len(raw))
	default:
		return fmt.Errorf("unknown path %q", line.Signal)
	}
	return nil
}

func numberValue(dp *metricspb.NumberDataPoint) float64 {
	switch v := dp.GetValue().(type) {
	case *metricspb.NumberDataPoint_AsDouble:
		return v.AsDouble
	case *metricspb.NumberDataPoint_AsInt:
		return float64(v.AsInt)
	}
	return 0
}

func loopbackURL(s string) error {
	if s == "" {
		return nil
	}
	u, err := url.Parse(s)
	if err != nil {
		return err
	}
	if ip := net.ParseIP(u.Hostname()); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("%s: only loopback addresses", s)
	}
	return nil
}

func probeMain(args []string) error {
	fs := flag.NewFlagSet("probe", flag.ExitOnError)
	listen := fs.String("listen", "127.0.0.1:0", "OTLP/HTTP address the agent exports to (loopback)")
	upstream := fs.String("upstream", "", "the collector's OTLP/HTTP base URL (empty: answer 200 and drop)")
	logsUp := fs.String("logs-upstream", "", "where /v1/logs (forwarded facts) go (empty: answer 200 and drop)")
	jaeger := fs.String("jaeger", "", "Jaeger query base URL to poll for the traces seen")
	prom := fs.String("prom", "", "the collector's Prometheus endpoint to scrape for slowrank_straggler")
	ranks := fs.Int("ranks", 4, "a trace is queryable when it has this many train.step spans")
	pending := fs.Int("max-pending", 256, "traces followed in Jaeger at once (more are skipped and counted)")
	every := fs.Int("follow-every", 8, "follow the traces whose id's first byte is a multiple of this (a sample independent of timing and of the agent's baseline rule)")
	out := fs.String("out", "probe.jsonl", "JSON lines written here")
	ready := fs.String("ready", "", "write the listening address to this file once listening")
	if err := fs.Parse(args); err != nil {
		return err
	}
	host, _, err := net.SplitHostPort(*listen)
	if err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return errors.New("--listen must be a loopback address")
	}
	for _, u := range []string{*upstream, *logsUp, *jaeger, *prom} {
		if err := loopbackURL(u); err != nil {
			return err
		}
	}
	f, err := os.Create(*out)
	if err != nil {
		return fmt.Errorf("create output: %w", err)
	}
	defer func() { _ = f.Close() }() // the result is flushed and synced below, or the run failed already
	rec := &recorder{w: bufio.NewWriterSize(f, 1<<16)}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	tr := &http.Transport{MaxIdleConnsPerHost: 16}
	p := &probe{upstream: strings.TrimRight(*upstream, "/"), logsUpstream: strings.TrimRight(*logsUp, "/"),
		client: &http.Client{Timeout: 15 * time.Second, Transport: tr}, rec: rec, tot: newTotals(), followEvery: max(1, *every), traceOf: map[string]traceKey{}}
	if *jaeger != "" {
		p.traces = make(chan newTrace, 4096)
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	srv := &http.Server{Handler: p, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintln(os.Stderr, "latency probe: serving stopped:", err)
		}
	}()
	if *ready != "" {
		if err := os.WriteFile(*ready, []byte(ln.Addr().String()+"\n"), 0o644); err != nil {
			return err
		}
	}
	clock := func() {
		rec.write(map[string]any{"kind": "clock", "wall_ns": time.Now().UnixNano(), "mono_ns": monoclock.Now()})
	}
	clock()
	var wg sync.WaitGroup
	var skipped, timeouts int
	if *jaeger != "" {
		wg.Add(1)
		go func() {
			defer wg.Done()
			skipped, timeouts = watchJaeger(ctx, p.client, strings.TrimRight(*jaeger, "/"), p.traces, *ranks, *pending, rec)
		}()
	}
	if *prom != "" {
		wg.Add(1)
		go func() { defer wg.Done(); watchProm(ctx, p.client, *prom, rec) }()
	}
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-tick.C:
			clock()
			_ = rec.flush() // its error stays: the last flush returns it
		}
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		fmt.Fprintln(os.Stderr, "latency probe: requests still in flight at the end are not recorded:", err)
	}
	wg.Wait()
	clock()
	p.tot.mu.Lock()
	rec.write(map[string]any{"kind": "totals", "totals": p.tot, "jaeger_skipped": skipped, "jaeger_timeouts": timeouts})
	p.tot.mu.Unlock()
	if err := rec.flush(); err != nil {
		return fmt.Errorf("write %s: %w", *out, err)
	}
	return f.Sync()
}

// followed says whether the trace with hex id is in the sample that the
// Jaeger watcher follows: its first byte is a multiple of every. Which steps
// the agent keeps as baseline depends on the id's low 64 bits, so this
// sample is independent of it, and of when the trace arrived.
func followed(id string, every int) bool {
	b, err := hex.DecodeString(id)
	return err == nil && len(b) > 0 && int(b[0])%every == 0
}

// watchJaeger follows each trace the proxy saw until Jaeger returns it with
// a train.step span of every rank that the proxy saw for it (one "jaeger"
// line: the latest span end and when it was seen) or 30 s passed
// ("jaeger_timeout"). The agent keeps all ranks of a step only while an alert
// is active; a candidate's steps and the baseline can have fewer.
func watchJaeger(ctx context.Context, c *http.Client, base string, in <-chan newTrace, ranks, maxPending int, rec *recorder) (skipped, timeouts int) {
	type follow struct {
		newTrace
		want  map[int]bool
		since time.Time
		polls int
	}
	pending := map[string]*follow{}
	done := map[string]bool{}
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return skipped, timeouts
		case t := <-in:
			if f := pending[t.id]; f != nil {
				for _, r := range t.ranks {
					f.want[r] = true
				}
				continue
			}
			if done[t.id] {
				continue
			}
			if len(pending) >= maxPending {
				skipped++
				done[t.id] = true
				continue
			}
			f := &follow{newTrace: t, want: map[int]bool{}, since: time.Now()}
			for _, r := range t.ranks {
				f.want[r] = true
			}
			pending[t.id] = f
		case <-tick.C:
			for id, f := range pending {
				if ctx.Err() != nil {
					return skipped, timeouts
				}
				f.polls++
				n, end, err := jaegerTrace(ctx, c, base, id)
				now := time.Now()
				if err == nil && n >= min(len(f.want), ranks) {
					rec.write(map[string]any{"kind": "jaeger", "trace": id, "job": f.job, "step": f.step, "ranks": n,
						"step_end_ns": end, "seen_ns": now.UnixNano(), "polls": f.polls})
					delete(pending, id)
					done[id] = true
				} else if now.Sub(f.since) > 30*time.Second {
					rec.write(map[string]any{"kind": "jaeger_timeout", "trace": id, "job": f.job, "step": f.step, "ranks": n, "want": len(f.want)})
					timeouts++
					delete(pending, id)
					done[id] = true
				}
			}
		}
	}
}

// jaegerTrace returns the number of distinct ranks with a train.step span in
// trace id and the latest end of those spans (Unix ns).
func jaegerTrace(ctx context.Context, c *http.Client, base, id string) (int, int64, error) {
	rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodGet, base+"/api/traces/"+id, nil)
	if err != nil {
		return 0, 0, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body) // drained for the connection's reuse: the status is the error
		return 0, 0, fmt.Errorf("jaeger: %s", resp.Status)
	}
	var r struct {
		Data []struct {
			Spans []struct {
				OperationName string `json:"operationName"`
				StartTime     int64  `json:"startTime"`
				Duration      int64  `json:"duration"`
				Tags          []struct {
					Key   string `json:"key"`
					Value any    `json:"value"`
				} `json:"tags"`
			} `json:"spans"`
		} `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 32<<20)).Decode(&r); err != nil {
		return 0, 0, err
	}
	rs := map[string]bool{}
	var end int64
	for _, tr := range r.Data {
		for _, sp := range tr.Spans {
			if sp.OperationName != "train.step" {
				continue
			}
			for _, t := range sp.Tags {
				if t.Key == "slowrank.rank" {
					rs[fmt.Sprint(t.Value)] = true
				}
			}
			end = max(end, (sp.StartTime+sp.Duration)*1000)
		}
	}
	return len(rs), end, nil
}

var promLabel = regexp.MustCompile(`(\w+)="((?:[^"\\]|\\.)*)"`)

// parseStragglers returns the (job, rank, phase) of every slowrank_straggler
// sample of value 1 in a Prometheus text exposition.
func parseStragglers(body string) []stragglerPoint {
	var out []stragglerPoint
	for _, line := range strings.Split(body, "\n") {
		if !strings.HasPrefix(line, "slowrank_straggler{") {
			continue
		}
		i := strings.LastIndexByte(line, '}')
		if i < 0 {
			continue
		}
		f := strings.Fields(line[i+1:])
		if len(f) == 0 || f[0] != "1" {
			continue
		}
		var sp stragglerPoint
		for _, m := range promLabel.FindAllStringSubmatch(line[:i], -1) {
			switch m[1] {
			case "slowrank_job_id":
				sp.Job = m[2]
			case "rank":
				sp.Rank, _ = strconv.Atoi(m[2])
			case "phase":
				sp.Phase = m[2]
			}
		}
		out = append(out, sp)
	}
	return out
}

// watchProm scrapes url every 200 ms and writes one "prom" line the first
// time each (job, rank, phase) shows slowrank_straggler 1.
func watchProm(ctx context.Context, c *http.Client, u string, rec *recorder) {
	seen := map[stragglerPoint]bool{}
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		req, _ := http.NewRequestWithContext(rctx, http.MethodGet, u, nil)
		resp, err := c.Do(req)
		if err != nil {
			cancel()
			continue
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
		resp.Body.Close()
		cancel()
		now := time.Now()
		for _, sp := range parseStragglers(string(b)) {
			if !seen[sp] {
				seen[sp] = true
				rec.write(map[string]any{"kind": "prom", "job": sp.Job, "rank": sp.Rank, "phase": sp.Phase, "seen_ns": now.UnixNano()})
			}
		}
	}
}
