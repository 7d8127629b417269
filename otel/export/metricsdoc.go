package export

import (
	"fmt"
	"strings"

	"github.com/slowrank/slowrank/selfmetrics"
)

// MetricsDoc renders docs/metrics.md: the detector's result metrics
// (Results), the codes of slowrank.state (States), the rank placement
// labels and the self-metrics (selfmetrics.Markdown). go generate writes
// it; TestMetricsDocIsCurrent fails when the committed file differs.
func MetricsDoc() string {
	var b strings.Builder
	b.WriteString(`# slowrank's metrics

Generated from ` + "`otel/export/results.go`" + ` and ` + "`selfmetrics/table.go`" + ` by
` + "`go generate ./otel/export/`" + ` (or ` + "`make docs`" + `): do not edit.

The same instruments leave over OTLP (to the Collector, whose Prometheus
exporter serves them) and on the agent's ` + "`/metrics`" + ` (` + "`--status-addr`" + `). The
Prometheus names are those of OpenTelemetry's Prometheus translation: dots
become underscores, the unit a suffix, a counter ` + "`_total`" + `; the job is the
attribute ` + "`" + string(AttrJob) + "`" + ` (label ` + "`" + strings.ReplaceAll(string(AttrJob), ".", "_") + "`" + `).

## Results

What the detector found, per job, rank and phase.

| OpenTelemetry name | Prometheus name | kind | unit | description | attributes |
|---|---|---|---|---|---|
`)
	for _, r := range Results {
		attrs := "`" + strings.Join(r.Attrs, "`, `") + "`"
		if r.Placed {
			attrs += ", placement"
		}
		unit := "`" + r.Unit + "`"
		if r.Unit == "" {
			unit = "—"
		}
		fmt.Fprintf(&b, "| `%s` | `%s` | %s | %s | %s | %s |\n", r.Name, r.PromName(), r.Kind, unit,
			strings.ReplaceAll(r.Desc, "|", `\|`), attrs)
	}
	b.WriteString(`
### State codes

The value of ` + "`" + MetricState + "`" + ` (` + "`" + result(MetricState).PromName() + "`" + `); the alert rules
(` + "`deploy/prometheus/slowrank-rules.yaml`" + `) compare it with these numbers.
[verdicts.md](verdicts.md) says what each state means for an operator.

| code | state | meaning |
|---|---|---|
`)
	for _, s := range States {
		fmt.Fprintf(&b, "| %d | `%s` | %s |\n", s.Code, s.Name, s.Meaning)
	}
	b.WriteString(`
### Placement

The per-rank results (attributes ending in "placement" above) also carry
the rank's placement under dcgm-exporter's label names, each only when
known: ` + "`" + strings.Join(placementKeys(), "`, `") + "`" + ` (` + "`" + string(KeyGPU) + "`" + ` is the NVML
index, ` + "`" + string(KeyHPCJob) + "`" + ` the Slurm job id). They are fixed per rank process, so they add no
series; [deploy.md](deploy.md#25-joining-with-dcgm-exporter) joins them with
dcgm-exporter's series.

`)
	b.WriteString(selfmetrics.Markdown())
	return b.String()
}

// placementKeys are the metric attribute keys of a rank's placement, in
// the order appendTo writes them.
func placementKeys() []string {
	l := rankLabels{uuid: "x", gpu: "x", bus: "x", host: "x", pod: "x", namespace: "x", container: "x", hpcJob: "x"}
	var out []string
	for _, kv := range l.appendTo(nil) {
		out = append(out, string(kv.Key))
	}
	return out
}
