// Command otelcol is a minimal OpenTelemetry Collector for slowrank's
// end-to-end tests. It is what the collector builder (ocb) would generate for
// the components listed in components(), written by hand so that CI needs no
// builder tool: OTLP receiver, batch processor, OTLP/OTLP-HTTP/debug
// exporters, the contrib Prometheus exporter and the contrib loadbalancing
// exporter (deploy/otelcol-loadbalancing.yaml). The loadbalancing exporter
// is v0.148.0, the newest release the module proxy serves, built here
// against collector v0.165.0: the end-to-end test
// TestLoadBalancedAggregators is what says the pair works.
package main

import (
	"log"

	"github.com/open-telemetry/opentelemetry-collector-contrib/exporter/loadbalancingexporter"
	"github.com/open-telemetry/opentelemetry-collector-contrib/exporter/prometheusexporter"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/confmap/provider/envprovider"
	"go.opentelemetry.io/collector/confmap/provider/fileprovider"
	"go.opentelemetry.io/collector/confmap/provider/yamlprovider"
	"go.opentelemetry.io/collector/connector"
	"go.opentelemetry.io/collector/exporter"
	"go.opentelemetry.io/collector/exporter/debugexporter"
	"go.opentelemetry.io/collector/exporter/otlpexporter"
	"go.opentelemetry.io/collector/exporter/otlphttpexporter"
	"go.opentelemetry.io/collector/extension"
	"go.opentelemetry.io/collector/otelcol"
	"go.opentelemetry.io/collector/processor"
	"go.opentelemetry.io/collector/processor/batchprocessor"
	"go.opentelemetry.io/collector/receiver"
	"go.opentelemetry.io/collector/receiver/otlpreceiver"
	"go.opentelemetry.io/collector/service/telemetry/otelconftelemetry"
)

func components() (otelcol.Factories, error) {
	var err error
	f := otelcol.Factories{Telemetry: otelconftelemetry.NewFactory()}
	if f.Receivers, err = otelcol.MakeFactoryMap[receiver.Factory](otlpreceiver.NewFactory()); err != nil {
		return otelcol.Factories{}, err
	}
	if f.Processors, err = otelcol.MakeFactoryMap[processor.Factory](batchprocessor.NewFactory()); err != nil {
		return otelcol.Factories{}, err
	}
	if f.Exporters, err = otelcol.MakeFactoryMap[exporter.Factory](
		otlpexporter.NewFactory(),
		otlphttpexporter.NewFactory(),
		debugexporter.NewFactory(),
		prometheusexporter.NewFactory(),
		loadbalancingexporter.NewFactory(),
	); err != nil {
		return otelcol.Factories{}, err
	}
	if f.Extensions, err = otelcol.MakeFactoryMap[extension.Factory](); err != nil {
		return otelcol.Factories{}, err
	}
	if f.Connectors, err = otelcol.MakeFactoryMap[connector.Factory](); err != nil {
		return otelcol.Factories{}, err
	}
	const core = "go.opentelemetry.io/collector"
	f.ReceiverModules = map[component.Type]string{otlpreceiver.NewFactory().Type(): core + "/receiver/otlpreceiver v0.165.0"}
	f.ProcessorModules = map[component.Type]string{batchprocessor.NewFactory().Type(): core + "/processor/batchprocessor v0.165.0"}
	f.ExporterModules = map[component.Type]string{
		otlpexporter.NewFactory().Type():          core + "/exporter/otlpexporter v0.165.0",
		otlphttpexporter.NewFactory().Type():      core + "/exporter/otlphttpexporter v0.165.0",
		debugexporter.NewFactory().Type():         core + "/exporter/debugexporter v0.165.0",
		prometheusexporter.NewFactory().Type():    "github.com/open-telemetry/opentelemetry-collector-contrib/exporter/prometheusexporter v0.165.1",
		loadbalancingexporter.NewFactory().Type(): "github.com/open-telemetry/opentelemetry-collector-contrib/exporter/loadbalancingexporter v0.148.0",
	}
	return f, nil
}

func main() {
	info := component.BuildInfo{
		Command:     "otelcol-slowrank",
		Description: "OpenTelemetry Collector for slowrank end-to-end tests",
		Version:     "0.165.0-slowrank",
	}
	set := otelcol.CollectorSettings{
		BuildInfo: info,
		Factories: components,
		ConfigProviderSettings: otelcol.ConfigProviderSettings{
			ResolverSettings: confmap.ResolverSettings{
				ProviderFactories: []confmap.ProviderFactory{
					envprovider.NewFactory(),
					fileprovider.NewFactory(),
					yamlprovider.NewFactory(),
				},
				DefaultScheme: "env",
			},
		},
	}
	if err := otelcol.NewCommand(set).Execute(); err != nil {
		log.Fatalf("collector server run finished with error: %v", err)
	}
}
