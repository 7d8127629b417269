package export

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/slowrank/slowrank/selfmetrics"
)

// Protocols of OTEL_EXPORTER_OTLP_PROTOCOL.
const (
	ProtocolGRPC         = "grpc"
	ProtocolHTTPProtobuf = "http/protobuf"
)

// Exporter kinds of OTEL_TRACES_EXPORTER and OTEL_METRICS_EXPORTER.
const (
	KindOTLP    = "otlp"
	KindConsole = "console" // traces only: pretty JSON on Config.Stdout or os.Stdout
	KindNone    = "none"
)

// ErrConfig is wrapped by every configuration error of New.
var ErrConfig = errors.New("invalid otel configuration")

// Config configures New. The zero value exports both signals over OTLP as
// the standard OTEL_* environment variables say (defaults: http/protobuf to
// localhost:4318). Explicit fields override the environment.
type Config struct {
	// Job, when set, becomes the resource attribute slowrank.job.id. Leave it
	// empty when one agent watches several jobs: every span and data point
	// carries slowrank.job.id / job anyway.
	Job string
	// ServiceVersion is service.version (default "dev").
	ServiceVersion string
	// HostName overrides host.name (default os.Hostname()).
	HostName string

	// Endpoint overrides OTEL_EXPORTER_OTLP_ENDPOINT for both signals: a URL
	// (http://127.0.0.1:4318) or host:port. For http/protobuf a base URL gets
	// /v1/traces and /v1/metrics appended, as the variable does.
	Endpoint string
	// TracesEndpoint / MetricsEndpoint override the per-signal variables
	// and are used as they are (no path appended).
	TracesEndpoint, MetricsEndpoint string
	// Protocol overrides OTEL_EXPORTER_OTLP_PROTOCOL ("grpc" or "http/protobuf").
	Protocol string
	// Insecure overrides OTEL_EXPORTER_OTLP_INSECURE (plaintext gRPC/HTTP
	// when the endpoint has no scheme). A URL scheme http:// or https:// wins.
	Insecure *bool
	// Headers are merged over OTEL_EXPORTER_OTLP_HEADERS (and the per-signal
	// variables); these win on equal keys.
	Headers map[string]string
	// Timeout overrides OTEL_EXPORTER_OTLP_TIMEOUT: the limit of one export.
	Timeout time.Duration

	// Traces / Metrics override OTEL_TRACES_EXPORTER / OTEL_METRICS_EXPORTER:
	// "otlp", "console" (traces only) or "none".
	Traces, Metrics string
	// Stdout also writes every exported span, pretty-printed, to this writer
	// (debugging). With Traces "console" it defaults to os.Stdout.
	Stdout io.Writer

	// MetricInterval overrides OTEL_METRIC_EXPORT_INTERVAL (default 5s).
	MetricInterval time.Duration

	Queue  QueueConfig
	Policy Policy

	// Self are the sources of the other components' self-metrics (the
	// agent's counters and gauges, the aggregator's), read at each metric
	// collection; the exporter adds its own and the process' CPU and RSS.
	// Every key is declared in selfmetrics.Table.
	Self []selfmetrics.Source

	// NowMono returns CLOCK_MONOTONIC now in ns (the clock of step facts);
	// default reads CLOCK_MONOTONIC. Used for slowrank.verdict.latency.
	NowMono func() int64
	// MonoToWall maps a fact's *_ns onto wall-clock time for span
	// timestamps; default assumes CLOCK_MONOTONIC of this host (offset taken
	// once at New).
	MonoToWall func(ns int64) time.Time

	Logger *slog.Logger

	// Env looks up environment variables (default os.LookupEnv); tests set it.
	Env func(string) (string, bool)

	// SpanExporter and MetricReader replace the OTLP/console exporters when
	// set (tests: tracetest.InMemoryExporter, sdkmetric.NewManualReader).
	SpanExporter sdktrace.SpanExporter
	MetricReader sdkmetric.Reader
	// MetricReaders also read every instrument (the agent's /metrics: the
	// OpenTelemetry Prometheus exporter). With them the meter provider
	// exists even when Metrics is "none".
	MetricReaders []sdkmetric.Reader
}

// QueueConfig bounds the span export queue. It mirrors the SDK's
// BatchSpanProcessor options; slowrank uses its own processor because the
// SDK's does not report what it drops.
type QueueConfig struct {
	MaxQueueSize       int           // spans waiting for export (default 8192)
	MaxExportBatchSize int           // spans per export call (default 512)
	BatchTimeout       time.Duration // longest wait before a partial batch leaves (default 1s)
	// SettleQueue bounds the settled windows waiting for span building
	// (default 64); a full queue drops the window's spans, counted.
	SettleQueue int
}

// Policy is the span export policy for large jobs (see doc.go).
type Policy struct {
	// SampleEvery exports every rank of a step whose trace id (job, step)
	// hashes to 0 modulo SampleEvery as the baseline (default 20; negative:
	// no baseline, 1: every step).
	SampleEvery int
	// MaxBufferedSteps bounds the step facts held until their window settles
	// (default 65536). Overflow drops whole oldest windows, counted.
	MaxBufferedSteps int
	// MaxSpansPerWindow bounds the spans one settled window may produce
	// (default 20000). Anomalous ranks go first, then side-by-side steps,
	// then the baseline; the rest is counted as dropped.
	MaxSpansPerWindow int
	// SettleLag force-settles (baseline only) a buffered window once a fact
	// of a window SettleLag windows newer arrives for the job, for callers
	// that never settle ok windows explicitly (default 8).
	SettleLag int64
	// KeepSettled is how many settled windows per job keep their decision so
	// that late facts are still exported as anomalous (default 8).
	KeepSettled int
	// NoPhaseSpans leaves out the phase.<name> child spans.
	NoPhaseSpans bool
}

func (q QueueConfig) withDefaults() QueueConfig {
	if q.MaxQueueSize <= 0 {
		q.MaxQueueSize = 8192
	}
	if q.MaxExportBatchSize <= 0 {
		q.MaxExportBatchSize = 512
	}
	if q.MaxExportBatchSize > q.MaxQueueSize {
		q.MaxExportBatchSize = q.MaxQueueSize
	}
	if q.BatchTimeout <= 0 {
		q.BatchTimeout = time.Second
	}
	if q.SettleQueue <= 0 {
		q.SettleQueue = 64
	}
	return q
}

func (p Policy) withDefaults() Policy {
	if p.SampleEvery == 0 {
		p.SampleEvery = 20
	}
	if p.MaxBufferedSteps <= 0 {
		p.MaxBufferedSteps = 65536
	}
	if p.MaxSpansPerWindow <= 0 {
		p.MaxSpansPerWindow = 20000
	}
	if p.SettleLag <= 0 {
		p.SettleLag = 8
	}
	if p.KeepSettled <= 0 {
		p.KeepSettled = 8
	}
	return p
}

// signalConfig is the resolved OTLP setting of one signal.
type signalConfig struct {
	Kind     string            // otlp, console, none
	Protocol string            // grpc, http/protobuf
	URL      string            // full URL with scheme (and path for HTTP)
	Headers  map[string]string // merged
	Timeout  time.Duration     // 0: exporter default
}

// resolved is the whole resolved configuration of the exporters.
type resolved struct {
	Traces, Metrics signalConfig
	MetricInterval  time.Duration
}

// resolve merges the environment (lookup) and the explicit Config, following
// the OTLP exporter specification: per-signal variables win over general
// ones, explicit fields over both. It is pure; New wraps it.
func resolve(cfg Config, lookup func(string) (string, bool)) (resolved, error) {
	env := func(k string) string {
		v, _ := lookup(k)
		return strings.TrimSpace(v)
	}
	var r resolved
	var err error
	if r.Traces, err = resolveSignal(cfg, env, "TRACES", "/v1/traces", cfg.TracesEndpoint, cfg.Traces); err != nil {
		return r, err
	}
	if r.Metrics, err = resolveSignal(cfg, env, "METRICS", "/v1/metrics", cfg.MetricsEndpoint, cfg.Metrics); err != nil {
		return r, err
	}
	if r.Metrics.Kind == KindConsole {
		return r, fmt.Errorf("%w: metrics exporter %q is not supported (use otlp or none)", ErrConfig, KindConsole)
	}
	r.MetricInterval = 5 * time.Second
	if v := env("OTEL_METRIC_EXPORT_INTERVAL"); v != "" {
		ms, err := strconv.Atoi(v)
		if err != nil || ms <= 0 {
			return r, fmt.Errorf("%w: OTEL_METRIC_EXPORT_INTERVAL=%q: want milliseconds", ErrConfig, v)
		}
		r.MetricInterval = time.Duration(ms) * time.Millisecond
	}
	if cfg.MetricInterval > 0 {
		r.MetricInterval = cfg.MetricInterval
	}
	return r, nil
}

func resolveSignal(cfg Config, env func(string) string, sig, path, explicitURL, explicitKind string) (signalConfig, error) {
	var s signalConfig
	s.Kind = firstNonEmpty(explicitKind, env("OTEL_"+sig+"_EXPORTER"), KindOTLP)
	switch s.Kind {
	case KindOTLP, KindConsole, KindNone:
	default:
		return s, fmt.Errorf("%w: %s exporter %q (want otlp, console or none)", ErrConfig, strings.ToLower(sig), s.Kind)
	}
	s.Protocol = firstNonEmpty(cfg.Protocol, env("OTEL_EXPORTER_OTLP_"+sig+"_PROTOCOL"), env("OTEL_EXPORTER_OTLP_PROTOCOL"), ProtocolHTTPProtobuf)
	if s.Protocol != ProtocolGRPC && s.Protocol != ProtocolHTTPProtobuf {
		return s, fmt.Errorf("%w: protocol %q (want grpc or http/protobuf)", ErrConfig, s.Protocol)
	}

	insecure := false
	if v := firstNonEmpty(env("OTEL_EXPORTER_OTLP_"+sig+"_INSECURE"), env("OTEL_EXPORTER_OTLP_INSECURE")); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return s, fmt.Errorf("%w: OTEL_EXPORTER_OTLP_INSECURE=%q", ErrConfig, v)
		}
		insecure = b
	}
	if cfg.Insecure != nil {
		insecure = *cfg.Insecure
	}

	// Endpoint precedence: explicit per-signal, explicit general, env
	// per-signal, env general, default. Per-signal values are used as given;
	// general ones are base URLs that get the signal path for HTTP.
	var endpoint string
	asIs := false
	switch {
	case explicitURL != "":
		endpoint, asIs = explicitURL, true
	case cfg.Endpoint != "":
		endpoint = cfg.Endpoint
	case env("OTEL_EXPORTER_OTLP_"+sig+"_ENDPOINT") != "":
		endpoint, asIs = env("OTEL_EXPORTER_OTLP_"+sig+"_ENDPOINT"), true
	case env("OTEL_EXPORTER_OTLP_ENDPOINT") != "":
		endpoint = env("OTEL_EXPORTER_OTLP_ENDPOINT")
	default:
		endpoint = "http://localhost:4318"
		if s.Protocol == ProtocolGRPC {
			endpoint = "http://localhost:4317"
		}
	}
	u, err := endpointURL(endpoint, insecure)
	if err != nil {
		return s, err
	}
	if s.Protocol == ProtocolHTTPProtobuf && !asIs {
		u.Path = strings.TrimSuffix(u.Path, "/") + path
	}
	s.URL = u.String()

	s.Headers = map[string]string{}
	for _, k := range []string{"OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_" + sig + "_HEADERS"} {
		if err := parseHeaders(env(k), s.Headers); err != nil {
			return s, fmt.Errorf("%w: %s: %w", ErrConfig, k, err)
		}
	}
	for k, v := range cfg.Headers {
		s.Headers[k] = v
	}

	if v := firstNonEmpty(env("OTEL_EXPORTER_OTLP_"+sig+"_TIMEOUT"), env("OTEL_EXPORTER_OTLP_TIMEOUT")); v != "" {
		ms, err := strconv.Atoi(v)
		if err != nil || ms <= 0 {
			return s, fmt.Errorf("%w: OTEL_EXPORTER_OTLP_TIMEOUT=%q: want milliseconds", ErrConfig, v)
		}
		s.Timeout = time.Duration(ms) * time.Millisecond
	}
	if cfg.Timeout > 0 {
		s.Timeout = cfg.Timeout
	}
	return s, nil
}

// endpointURL accepts a URL or host:port; without a scheme, insecure picks
// http:// else https://.
func endpointURL(endpoint string, insecure bool) (*url.URL, error) {
	if !strings.Contains(endpoint, "://") {
		scheme := "https://"
		if insecure {
			scheme = "http://"
		}
		endpoint = scheme + endpoint
	}
	u, err := url.Parse(endpoint)
	if err != nil {
		return nil, fmt.Errorf("%w: endpoint %q: %w", ErrConfig, endpoint, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("%w: endpoint %q: scheme must be http or https", ErrConfig, endpoint)
	}
	if u.Host == "" {
		return nil, fmt.Errorf("%w: endpoint %q has no host", ErrConfig, endpoint)
	}
	return u, nil
}

// parseHeaders parses the W3C-baggage-like "k1=v1,k2=v2" list of
// OTEL_EXPORTER_OTLP_HEADERS (values URL-encoded) into into.
func parseHeaders(s string, into map[string]string) error {
	if s == "" {
		return nil
	}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			return fmt.Errorf("header %q: want key=value", strings.TrimSpace(kv))
		}
		dv, err := url.PathUnescape(strings.TrimSpace(v))
		if err != nil {
			return fmt.Errorf("header %q: %w", k, err)
		}
		into[k] = dv
	}
	return nil
}

func firstNonEmpty(vs ...string) string {
	for _, v := range vs {
		if v != "" {
			return v
		}
	}
	return ""
}

func defaultEnv(cfg Config) func(string) (string, bool) {
	if cfg.Env != nil {
		return cfg.Env
	}
	return os.LookupEnv
}
