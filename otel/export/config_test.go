package export

import (
	"errors"
	"maps"
	"testing"
	"time"
)

func TestResolve(t *testing.T) {
	yes, no := true, false
	tests := []struct {
		name          string
		env           map[string]string
		cfg           Config
		traces, mets  string // URLs
		proto         string
		headers       map[string]string
		interval      time.Duration
		tracesTimeout time.Duration
		err           bool
	}{
		{name: "defaults", traces: "http://localhost:4318/v1/traces", mets: "http://localhost:4318/v1/metrics",
			proto: ProtocolHTTPProtobuf, headers: map[string]string{}, interval: 5 * time.Second},
		{name: "grpc default port", env: map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
			traces: "http://localhost:4317", mets: "http://localhost:4317", proto: ProtocolGRPC, headers: map[string]string{}, interval: 5 * time.Second},
		{name: "base endpoint gets signal paths", env: map[string]string{
			"OTEL_EXPORTER_OTLP_ENDPOINT": "https://otel.example:4318/base/", "OTEL_EXPORTER_OTLP_HEADERS": "a=1,b=x%20y",
			"OTEL_EXPORTER_OTLP_TRACES_HEADERS": "b=2", "OTEL_METRIC_EXPORT_INTERVAL": "1500", "OTEL_EXPORTER_OTLP_TIMEOUT": "2000"},
			traces: "https://otel.example:4318/base/v1/traces", mets: "https://otel.example:4318/base/v1/metrics",
			proto: ProtocolHTTPProtobuf, headers: map[string]string{"a": "1", "b": "2"}, interval: 1500 * time.Millisecond, tracesTimeout: 2 * time.Second},
		{name: "per-signal endpoint as is", env: map[string]string{
			"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:9999/custom"},
			traces: "http://t:9999/custom", mets: "http://c:4318/v1/metrics", proto: ProtocolHTTPProtobuf, headers: map[string]string{}, interval: 5 * time.Second},
		{name: "explicit overrides env", env: map[string]string{
			"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_EXPORTER_OTLP_INSECURE": "false"},
			cfg:    Config{Endpoint: "127.0.0.1:4317", Protocol: ProtocolGRPC, Insecure: &yes, Headers: map[string]string{"k": "v"}, MetricInterval: time.Second},
			traces: "http://127.0.0.1:4317", mets: "http://127.0.0.1:4317", proto: ProtocolGRPC, headers: map[string]string{"k": "v"}, interval: time.Second},
		{name: "no scheme secure by default", cfg: Config{Endpoint: "collector:4318", Insecure: &no},
			traces: "https://collector:4318/v1/traces", mets: "https://collector:4318/v1/metrics", proto: ProtocolHTTPProtobuf, headers: map[string]string{}, interval: 5 * time.Second},
		{name: "insecure env", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "c:4317", "OTEL_EXPORTER_OTLP_INSECURE": "true", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
			traces: "http://c:4317", mets: "http://c:4317", proto: ProtocolGRPC, headers: map[string]string{}, interval: 5 * time.Second},
		{name: "bad protocol", env: map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, err: true},
		{name: "bad header", env: map[string]string{"OTEL_EXPORTER_OTLP_HEADERS": "novalue"}, err: true},
		{name: "bad scheme", cfg: Config{Endpoint: "ftp://x:1"}, err: true},
		{name: "console metrics", env: map[string]string{"OTEL_METRICS_EXPORTER": "console"}, err: true},
		{name: "bad interval", env: map[string]string{"OTEL_METRIC_EXPORT_INTERVAL": "soon"}, err: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := resolve(tc.cfg, testEnv(tc.env))
			if tc.err {
				if !errors.Is(err, ErrConfig) {
					t.Fatalf("err = %v, want ErrConfig", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if r.Traces.URL != tc.traces || r.Metrics.URL != tc.mets {
				t.Errorf("urls %q %q, want %q %q", r.Traces.URL, r.Metrics.URL, tc.traces, tc.mets)
			}
			if r.Traces.Protocol != tc.proto {
				t.Errorf("protocol %q", r.Traces.Protocol)
			}
			if !maps.Equal(r.Traces.Headers, tc.headers) {
				t.Errorf("headers %v, want %v", r.Traces.Headers, tc.headers)
			}
			if r.MetricInterval != tc.interval {
				t.Errorf("interval %v", r.MetricInterval)
			}
			if r.Traces.Timeout != tc.tracesTimeout {
				t.Errorf("timeout %v", r.Traces.Timeout)
			}
		})
	}
}
