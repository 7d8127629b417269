// Command otelcol-mini is the smallest OpenTelemetry Collector that a real
// slowrank deployment would export to: the OTLP receiver (gRPC :4317 and
// HTTP :4318) and the debug and nop exporters, nothing else. It exists so
// that bench/gpu/c1matrix.sh measures the agent's overhead with OTLP export
// on, to a real collector on the same host. It is what the collector builder
// (ocb) would generate for these components, written by hand (see
// test/e2e/tools/otelcol for the larger one of the end-to-end tests).
//
// Build (on the development machine; the binary travels in bin/):
//
//	cd bench/otelcol-mini && CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o ../../bin/otelcol-mini .
package main

import (
	"context"
	"log"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/confmap/provider/envprovider"
	"go.opentelemetry.io/collector/confmap/provider/fileprovider"
	"go.opentelemetry.io/collector/confmap/provider/yamlprovider"
	"go.opentelemetry.io/collector/connector"
	"go.opentelemetry.io/collector/exporter"
	"go.opentelemetry.io/collector/exporter/debugexporter"
	"go.opentelemetry.io/collector/exporter/nopexporter"
	"go.opentelemetry.io/collector/extension"
	"go.opentelemetry.io/collector/otelcol"
	"go.opentelemetry.io/collector/processor"
	"go.opentelemetry.io/collector/receiver"
	"go.opentelemetry.io/collector/receiver/otlpreceiver"
	"go.opentelemetry.io/collector/service/telemetry"
	"go.uber.org/zap"
)

const version = "v0.165.0"

func components() (otelcol.Factories, error) {
	var err error
	f := otelcol.Factories{Telemetry: logOnlyTelemetry()}
	if f.Receivers, err = otelcol.MakeFactoryMap[receiver.Factory](otlpreceiver.NewFactory()); err != nil {
		return otelcol.Factories{}, err
	}
	if f.Processors, err = otelcol.MakeFactoryMap[processor.Factory](); err != nil {
		return otelcol.Factories{}, err
	}
	if f.Exporters, err = otelcol.MakeFactoryMap[exporter.Factory](debugexporter.NewFactory(), nopexporter.NewFactory()); err != nil {
		return otelcol.Factories{}, err
	}
	if f.Extensions, err = otelcol.MakeFactoryMap[extension.Factory](); err != nil {
		return otelcol.Factories{}, err
	}
	if f.Connectors, err = otelcol.MakeFactoryMap[connector.Factory](); err != nil {
		return otelcol.Factories{}, err
	}
	const core = "go.opentelemetry.io/collector"
	f.ReceiverModules = map[component.Type]string{otlpreceiver.NewFactory().Type(): core + "/receiver/otlpreceiver " + version}
	f.ExporterModules = map[component.Type]string{
		debugexporter.NewFactory().Type(): core + "/exporter/debugexporter " + version,
		nopexporter.NewFactory().Type():   core + "/exporter/nopexporter " + version,
	}
	return f, nil
}

// telemetryConfig is the service's telemetry section: there is none (the
// configuration must not have a service::telemetry key).
type telemetryConfig struct{}

// logOnlyTelemetry is the collector's own telemetry reduced to its log (info
// and above, on stderr, where the debug exporter writes): no internal
// metrics or traces. The stock otelconftelemetry factory links the OTel SDK's
// exporters and every cloud resource detector (AWS, GCP, Azure, k8s), which
// more than doubles the binary.
func logOnlyTelemetry() telemetry.Factory {
	return telemetry.NewFactory(
		func() component.Config { return &telemetryConfig{} },
		telemetry.WithCreateLogger(func(_ context.Context, set telemetry.LoggerSettings, _ component.Config) (*zap.Logger, component.ShutdownFunc, error) {
			zc := zap.NewProductionConfig()
			zc.Encoding = "console"
			zc.Sampling = nil
			zc.OutputPaths, zc.ErrorOutputPaths = []string{"stderr"}, []string{"stderr"}
			build := set.BuildZapLogger
			if build == nil {
				build = func(c zap.Config, opts ...zap.Option) (*zap.Logger, error) { return c.Build(opts...) }
			}
			l, err := build(zc)
			if err != nil {
				return nil, nil, err
			}
			return l, func(context.Context) error { _ = l.Sync(); return nil }, nil
		}),
	)
}

func main() {
	set := otelcol.CollectorSettings{
		BuildInfo: component.BuildInfo{
			Command:     "otelcol-mini",
			Description: "Minimal OpenTelemetry Collector (OTLP in; debug and nop out) for slowrank's GPU benchmarks",
			Version:     "0.165.0-slowrank",
		},
		Factories: components,
		ConfigProviderSettings: otelcol.ConfigProviderSettings{
			ResolverSettings: confmap.ResolverSettings{
				ProviderFactories: []confmap.ProviderFactory{envprovider.NewFactory(), fileprovider.NewFactory(), yamlprovider.NewFactory()},
				DefaultScheme:     "env",
			},
		},
	}
	if err := otelcol.NewCommand(set).Execute(); err != nil {
		log.Fatalf("collector server run finished with error: %v", err)
	}
}
