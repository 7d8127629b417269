package export

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/slowrank/slowrank/detector"
	"github.com/slowrank/slowrank/internal/monoclock"
)

// ScopeName is the instrumentation scope of slowrank's spans and metrics.
// It names the package's former path and stays as it is: the back ends
// (queries, dashboards) see it.
const ScopeName = "github.com/slowrank/slowrank/otel"

// Exporter turns step facts, verdicts and self-metrics into OpenTelemetry
// spans and metrics. Its methods are safe for concurrent use and never block
// on the network: step facts wait in a bounded buffer for their window's
// verdicts, spans are built on an internal goroutine and exported through a
// bounded queue; whatever does not fit is dropped and counted.
type Exporter struct {
	log        *slog.Logger
	policy     Policy
	nowMono    func() int64
	monoToWall func(int64) time.Time

	tp     *sdktrace.TracerProvider // nil when traces are off
	procs  []*queueProcessor
	tracer trace.Tracer
	mp     *sdkmetric.MeterProvider // nil when metrics are off
	inst   *instruments
	series *seriesState
	stats  exportStats

	mu     sync.Mutex // guards buf, topo, closed; non-blocking sends on work
	buf    *stepBuffer
	topo   map[string]map[int]detector.RankInfo
	closed bool
	work   chan settledWindow // never closed; stop ends the worker

	stop       chan struct{}
	workerDone chan struct{}
	shutOnce   sync.Once
	shutErr    error
}

// New builds the exporters and providers from cfg (see Config) and starts
// the span-building goroutine. Close it with Shutdown. Nothing here dials:
// an unreachable endpoint shows up later as counted export errors.
func New(ctx context.Context, cfg Config) (*Exporter, error) {
	installErrorHandler()
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("component", "otel")
	SetErrorLogger(log)

	r, err := resolve(cfg, defaultEnv(cfg))
	if err != nil {
		return nil, err
	}
	res, err := buildResource(ctx, cfg)
	if err != nil {
		return nil, err
	}
	q := cfg.Queue.withDefaults()
	e := &Exporter{
		log:        log,
		policy:     cfg.Policy.withDefaults(),
		nowMono:    cfg.NowMono,
		monoToWall: cfg.MonoToWall,
		series:     newSeriesState(),
		topo:       map[string]map[int]detector.RankInfo{},
		work:       make(chan settledWindow, q.SettleQueue),
		stop:       make(chan struct{}),
		workerDone: make(chan struct{}),
	}
	e.buf = newStepBuffer(e.policy)
	if e.nowMono == nil {
		e.nowMono = monoclock.Now
	}
	if e.monoToWall == nil {
		e.monoToWall = monoclock.WallMapper()
	}

	// Traces.
	addExp := func(x sdktrace.SpanExporter, timeout time.Duration) {
		e.procs = append(e.procs, newQueueProcessor(x, q, timeout, &e.stats))
	}
	switch {
	case cfg.SpanExporter != nil:
		addExp(cfg.SpanExporter, r.Traces.Timeout)
	case r.Traces.Kind == KindOTLP:
		x, err := newOTLPTraceExporter(ctx, r.Traces)
		if err != nil {
			return nil, err
		}
		addExp(x, r.Traces.Timeout)
	case r.Traces.Kind == KindConsole && cfg.Stdout == nil:
		cfg.Stdout = os.Stdout
	}
	if cfg.Stdout != nil {
		x, err := newStdoutExporter(cfg.Stdout)
		if err != nil {
			for _, p := range e.procs {
				_ = p.Shutdown(ctx)
			}
			return nil, err
		}
		addExp(x, 0)
	}
	if len(e.procs) > 0 {
		opts := []sdktrace.TracerProviderOption{
			sdktrace.WithResource(res),
			sdktrace.WithIDGenerator(idGenerator{}),
			sdktrace.WithSampler(sdktrace.AlwaysSample()), // the policy samples, not the SDK
		}
		for _, p := range e.procs {
			opts = append(opts, sdktrace.WithSpanProcessor(p))
		}
		e.tp = sdktrace.NewTracerProvider(opts...)
		e.tracer = e.tp.Tracer(ScopeName, trace.WithInstrumentationVersion(version(cfg)))
	}

	// Metrics.
	reader := cfg.MetricReader
	if reader == nil && r.Metrics.Kind == KindOTLP {
		x, err := newOTLPMetricExporter(ctx, r.Metrics)
		if err != nil {
			_ = e.shutdownProviders(ctx)
			return nil, err
		}
		reader = sdkmetric.NewPeriodicReader(&countingMetricExporter{Exporter: x, stats: &e.stats},
			sdkmetric.WithInterval(r.MetricInterval))
	}
	var readers []sdkmetric.Reader
	if reader != nil {
		readers = append(readers, reader)
	}
	readers = append(readers, cfg.MetricReaders...)
	if len(readers) > 0 {
		opts := []sdkmetric.Option{sdkmetric.WithResource(res)}
		for _, r := range readers {
			opts = append(opts, sdkmetric.WithReader(r))
		}
		e.mp = sdkmetric.NewMeterProvider(opts...)
		e.inst, err = newInstruments(e.mp.Meter(ScopeName, metricVersion(cfg)), e, cfg.Self)
		if err != nil {
			_ = e.shutdownProviders(ctx)
			return nil, fmt.Errorf("create instruments: %w", err)
		}
	}
	log.Debug("otel exporter ready", "traces", r.Traces.Kind, "traces_url", r.Traces.URL,
		"metrics", r.Metrics.Kind, "metrics_url", r.Metrics.URL, "protocol", r.Traces.Protocol)
	go e.worker()
	return e, nil
}

func version(cfg Config) string {
	if cfg.ServiceVersion == "" {
		return "dev"
	}
	return cfg.ServiceVersion
}

func buildResource(ctx context.Context, cfg Config) (*resource.Resource, error) {
	host := cfg.HostName
	if host == "" {
		host, _ = os.Hostname()
	}
	defaults := resource.NewWithAttributes(semconv.SchemaURL,
		semconv.ServiceName("slowrank"),
		semconv.ServiceVersion(version(cfg)),
		semconv.HostName(host),
		// One agent per host: the host is the instance (Prometheus'
		// instance label), so agents' self-metrics do not collide.
		semconv.ServiceInstanceID(host),
		semconv.ProcessPID(os.Getpid()),
	)
	sdk, err := resource.New(ctx, resource.WithTelemetrySDK())
	if err != nil {
		return nil, fmt.Errorf("detect sdk resource: %w", err)
	}
	// OTEL_RESOURCE_ATTRIBUTES / OTEL_SERVICE_NAME may override the defaults.
	env, err := resource.New(ctx, resource.WithFromEnv())
	if err != nil {
		return nil, fmt.Errorf("read resource from environment: %w", err)
	}
	var explicit []attribute.KeyValue
	if cfg.HostName != "" {
		explicit = append(explicit, semconv.HostName(cfg.HostName), semconv.ServiceInstanceID(cfg.HostName))
	}
	if cfg.Job != "" {
		explicit = append(explicit, AttrJob.String(cfg.Job))
	}
	res := defaults
	for _, r := range []*resource.Resource{sdk, env, resource.NewSchemaless(explicit...)} {
		if res, err = resource.Merge(res, r); err != nil {
			return nil, fmt.Errorf("merge resource: %w", err)
		}
	}
	return res, nil
}

func newOTLPTraceExporter(ctx context.Context, s signalConfig) (sdktrace.SpanExporter, error) {
	var x sdktrace.SpanExporter
	var err error
	if s.Protocol == ProtocolGRPC {
		opts := []otlptracegrpc.Option{otlptracegrpc.WithEndpointURL(s.URL), otlptracegrpc.WithHeaders(s.Headers),
			otlptracegrpc.WithRetry(otlptracegrpc.RetryConfig(retryConfig))}
		if s.Timeout > 0 {
			opts = append(opts, otlptracegrpc.WithTimeout(s.Timeout))
		}
		x, err = otlptracegrpc.New(ctx, opts...)
	} else {
		opts := []otlptracehttp.Option{otlptracehttp.WithEndpointURL(s.URL), otlptracehttp.WithHeaders(s.Headers),
			otlptracehttp.WithRetry(otlptracehttp.RetryConfig(retryConfig))}
		if s.Timeout > 0 {
			opts = append(opts, otlptracehttp.WithTimeout(s.Timeout))
		}
		x, err = otlptracehttp.New(ctx, opts...)
	}
	if err != nil {
		return nil, fmt.Errorf("create otlp trace exporter (%s %s): %w", s.Protocol, s.URL, err)
	}
	return x, nil
}

func newOTLPMetricExporter(ctx context.Context, s signalConfig) (sdkmetric.Exporter, error) {
	var x sdkmetric.Exporter
	var err error
	if s.Protocol == ProtocolGRPC {
		opts := []otlpmetricgrpc.Option{otlpmetricgrpc.WithEndpointURL(s.URL), otlpmetricgrpc.WithHeaders(s.Headers),
			otlpmetricgrpc.WithRetry(otlpmetricgrpc.RetryConfig(retryConfig))}
		if s.Timeout > 0 {
			opts = append(opts, otlpmetricgrpc.WithTimeout(s.Timeout))
		}
		x, err = otlpmetricgrpc.New(ctx, opts...)
	} else {
		opts := []otlpmetrichttp.Option{otlpmetrichttp.WithEndpointURL(s.URL), otlpmetrichttp.WithHeaders(s.Headers),
			otlpmetrichttp.WithRetry(otlpmetrichttp.RetryConfig(retryConfig))}
		if s.Timeout > 0 {
			opts = append(opts, otlpmetrichttp.WithTimeout(s.Timeout))
		}
		x, err = otlpmetrichttp.New(ctx, opts...)
	}
	if err != nil {
		return nil, fmt.Errorf("create otlp metric exporter (%s %s): %w", s.Protocol, s.URL, err)
	}
	return x, nil
}

func newStdoutExporter(w io.Writer) (sdktrace.SpanExporter, error) {
	x, err := stdouttrace.New(stdouttrace.WithWriter(w), stdouttrace.WithPrettyPrint())
	if err != nil {
		return nil, fmt.Errorf("create stdout trace exporter: %w", err)
	}
	return x, nil
}

// RecordTopology remembers where the ranks of a job run (local rank, host,
// placement) for span and metric attributes. A newer version replaces an
// older one.
func (e *Exporter) RecordTopology(t detector.Topology) {
	m := make(map[int]detector.RankInfo, len(t.Ranks))
	for _, r := range t.Ranks {
		m[r.Rank] = r
	}
	e.mu.Lock()
	e.topo[t.Job] = m
	e.mu.Unlock()
}

// RecordStep takes one step fact and the index of the detector window it
// belongs to (the caller computes it with the detector's rule). Its duration
// metrics are recorded now; the fact waits for the window's verdicts
// (SettleWindow) to decide whether it becomes spans. It never blocks.
func (e *Exporter) RecordStep(s detector.Step, window int64) {
	if e.inst != nil {
		e.inst.recordStep(&s, e.rankLabelsOf(s.Job, s.Rank))
	}
	if e.tp == nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		e.stats.factsShutdown.Add(1)
		return
	}
	r := e.buf.add(s, window)
	if r.evicted > 0 {
		e.stats.dropOverflow.Add(int64(r.evicted))
	}
	for _, k := range r.forced {
		e.stats.forcedSettles.Add(1)
		for _, sw := range e.buf.settle(k, &decision{}) {
			e.enqueueLocked(sw)
		}
	}
	if r.isLate {
		e.stats.lateFacts.Add(1)
		e.enqueueLocked(settledWindow{key: windowKey{s.Job, window}, facts: []detector.Step{s}, maxEnd: s.EndNS, d: r.late, lateFact: true})
	}
}

// SettleWindow hands over the verdicts of one settled (job, window), which
// may be empty: call it for every window the detector settles, so that the
// buffered facts of healthy windows leave as the sampled baseline. Gauges
// and counters update now; spans are built on the exporter's goroutine.
// Settling a window also settles every older buffered window of the job.
func (e *Exporter) SettleWindow(job string, window int64, vs []detector.Verdict) {
	if e.inst != nil {
		e.inst.recordVerdicts(vs)
	}
	e.series.update(vs)
	if e.tp == nil {
		if e.inst != nil {
			e.inst.recordLatency(e.nowMono(), 0, vs)
		}
		return
	}
	d := decide(vs)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return
	}
	sws := e.buf.settle(windowKey{job, window}, d)
	sws[len(sws)-1].verdicts = vs
	for _, sw := range sws {
		e.enqueueLocked(sw)
	}
}

// RecordVerdicts groups a flat verdict list by (job, window) and settles
// each window in order of appearance (see SettleWindow). Windows without
// verdicts are not settled by it; SettleLag or a later window does that.
func (e *Exporter) RecordVerdicts(vs []detector.Verdict) {
	type group struct {
		key windowKey
		vs  []detector.Verdict
	}
	var groups []group
	idx := map[windowKey]int{}
	for _, v := range vs {
		k := windowKey{v.Job, v.Window}
		i, ok := idx[k]
		if !ok {
			i = len(groups)
			idx[k] = i
			groups = append(groups, group{key: k})
		}
		groups[i].vs = append(groups[i].vs, v)
	}
	for _, g := range groups {
		e.SettleWindow(g.key.job, g.key.window, g.vs)
	}
}

// RecordSummary exports a job's closing summary as one span,
// slowrank.job.summary, in its own trace (id from "slowrank/<job>/summary").
func (e *Exporter) RecordSummary(s detector.Summary) {
	if e.tracer == nil {
		return
	}
	e.mu.Lock()
	closed := e.closed
	e.mu.Unlock()
	if closed {
		return
	}
	e.emitSummary(s)
}

// ForgetJob drops everything kept for a job that ended: buffered facts
// (exported as baseline first), settled decisions, topology and gauge series.
func (e *Exporter) ForgetJob(job string) {
	e.mu.Lock()
	out := e.buf.takeJob(job)
	e.buf.forget(job)
	delete(e.topo, job)
	if !e.closed {
		for _, sw := range out {
			e.enqueueLocked(sw)
		}
	}
	e.mu.Unlock()
	e.series.forget(job)
}

// enqueueLocked hands a settled window to the span-building goroutine, or
// counts its facts as dropped when that queue is full. e.mu must be held.
func (e *Exporter) enqueueLocked(sw settledWindow) {
	select {
	case e.work <- sw:
	default:
		e.stats.dropSettleQueue.Add(int64(len(sw.facts)))
		if e.inst != nil && sw.verdicts != nil {
			e.inst.recordLatency(e.nowMono(), sw.maxEnd, sw.verdicts)
		}
	}
}

func (e *Exporter) worker() {
	defer close(e.workerDone)
	for {
		select {
		case sw := <-e.work:
			e.emitWindow(sw)
		case <-e.stop:
			for {
				select {
				case sw := <-e.work:
					e.emitWindow(sw)
				default:
					return
				}
			}
		}
	}
}

// Shutdown exports what is buffered (unsettled windows as baseline), flushes
// spans and metrics, and stops. It returns by ctx's deadline; what could not
// leave by then is counted as dropped. Calls after the first return the first
// result.
func (e *Exporter) Shutdown(ctx context.Context) error {
	e.shutOnce.Do(func() {
		e.mu.Lock()
		e.closed = true
		rest := e.buf.drainAll()
		e.mu.Unlock()
		close(e.stop)

		var errs []error
		select {
		case <-e.workerDone:
		case <-ctx.Done():
			errs = append(errs, fmt.Errorf("wait for span builder: %w", ctx.Err()))
		}
		for _, sw := range rest {
			if ctx.Err() != nil {
				e.stats.factsShutdown.Add(int64(len(sw.facts)))
				continue
			}
			e.emitWindow(sw)
		}
		if err := e.shutdownProviders(ctx); err != nil {
			errs = append(errs, err)
		}
		e.shutErr = errors.Join(errs...)
	})
	return e.shutErr
}

// shutdownProviders flushes and stops both providers in parallel, so that a
// dead trace endpoint cannot eat the metrics' share of the deadline.
func (e *Exporter) shutdownProviders(ctx context.Context) error {
	var wg sync.WaitGroup
	var terr, merr error
	if e.tp != nil {
		wg.Go(func() {
			if err := e.tp.Shutdown(ctx); err != nil {
				terr = fmt.Errorf("shut down tracer provider: %w", err)
			}
		})
	}
	if e.mp != nil {
		wg.Go(func() {
			if err := e.mp.Shutdown(ctx); err != nil {
				merr = fmt.Errorf("shut down meter provider: %w", err)
			}
		})
	}
	wg.Wait()
	return errors.Join(terr, merr)
}

// ForceFlush waits until the span builder has caught up and the spans and
// metrics produced so far have been handed to the exporters, or ctx ends.
func (e *Exporter) ForceFlush(ctx context.Context) error {
	e.mu.Lock()
	closed := e.closed
	e.mu.Unlock()
	if closed {
		return nil
	}
	// A marker: when the worker reaches it, everything queued before is built.
	done := make(chan struct{})
	select {
	case e.work <- settledWindow{flushed: done}:
	case <-e.workerDone:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-done:
	case <-e.workerDone:
	case <-ctx.Done():
		return ctx.Err()
	}
	var errs []error
	if e.tp != nil {
		errs = append(errs, e.tp.ForceFlush(ctx))
	}
	if e.mp != nil {
		errs = append(errs, e.mp.ForceFlush(ctx))
	}
	return errors.Join(errs...)
}

// Stats is a snapshot of the export path's own counters.
type Stats struct {
	SpansExported int64
	// SpansDropped by reason (DropQueueFull, DropExportFailed, DropShutdown).
	SpansDropped map[string]int64
	// FactsDropped by reason (DropBufferOverflow, DropSettleQueue,
	// DropWindowBudget, DropShutdown: recorded after Shutdown or not built
	// by its deadline).
	FactsDropped map[string]int64
	// MetricPointsFailed counts data points of failed metric exports.
	MetricPointsFailed int64
	// ExportErrors counts errors reported to the OpenTelemetry error
	// handler in this process (all exporters).
	ExportErrors int64
	LateFacts    int64
	// ForcedSettles counts windows settled by Policy.SettleLag.
	ForcedSettles int64
	// BufferedSteps is the number of facts waiting for their window.
	BufferedSteps int
}

// Stats returns the export path's counters.
func (e *Exporter) Stats() Stats {
	e.mu.Lock()
	n := e.buf.n
	e.mu.Unlock()
	return Stats{
		SpansExported: e.stats.spansExported.Load(),
		SpansDropped: map[string]int64{
			DropQueueFull:    e.stats.dropQueueFull.Load(),
			DropExportFailed: e.stats.dropExportFailed.Load(),
			DropShutdown:     e.stats.dropShutdown.Load(),
		},
		FactsDropped: map[string]int64{
			DropBufferOverflow: e.stats.dropOverflow.Load(),
			DropSettleQueue:    e.stats.dropSettleQueue.Load(),
			DropWindowBudget:   e.stats.dropBudget.Load(),
			DropShutdown:       e.stats.factsShutdown.Load(),
		},
		MetricPointsFailed: e.stats.metricsFailed.Load(),
		ExportErrors:       exportErrors.Load(),
		LateFacts:          e.stats.lateFacts.Load(),
		ForcedSettles:      e.stats.forcedSettles.Load(),
		BufferedSteps:      n,
	}
}

// exportErrors counts everything reported to the global OpenTelemetry error
// handler (export failures of both signals, SDK complaints).
var (
	exportErrors atomic.Int64
	handlerOnce  sync.Once
	errLogger    atomic.Pointer[slog.Logger]
	lastErrLog   atomic.Int64 // unix ns of the last logged error
)

type countingHandler struct{}

// Handle counts err and logs it at most once every 10 s.
func (countingHandler) Handle(err error) {
	exportErrors.Add(1)
	now := time.Now().UnixNano()
	last := lastErrLog.Load()
	if now-last < int64(10*time.Second) || !lastErrLog.CompareAndSwap(last, now) {
		return
	}
	if l := errLogger.Load(); l != nil {
		l.Warn("opentelemetry export error (further errors for 10s only counted)", "err", err, "errors_total", exportErrors.Load())
	}
}

// installErrorHandler makes the process-wide OpenTelemetry error handler
// count instead of printing; export failures never crash or block.
func installErrorHandler() {
	handlerOnce.Do(func() { otel.SetErrorHandler(countingHandler{}) })
}

// SetErrorLogger sets where the rate-limited export error log goes (New
// sets it to its Config.Logger).
func SetErrorLogger(l *slog.Logger) { errLogger.Store(l) }

// countingMetricExporter counts the data points of failed metric exports.
type countingMetricExporter struct {
	sdkmetric.Exporter
	stats *exportStats
}

// retrySettings has the layout of the OTLP exporters' RetryConfig: short
// retries, since the bounded queue, not the retry loop, absorbs outages.
type retrySettings struct {
	Enabled         bool
	InitialInterval time.Duration
	MaxInterval     time.Duration
	MaxElapsedTime  time.Duration
}

var retryConfig = retrySettings{Enabled: true, InitialInterval: 500 * time.Millisecond, MaxInterval: 5 * time.Second, MaxElapsedTime: 15 * time.Second}

func metricVersion(cfg Config) metric.MeterOption {
	return metric.WithInstrumentationVersion(version(cfg))
}
