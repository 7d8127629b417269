package selfmetrics

import (
	"fmt"
	"strings"
)

// Markdown renders Table as docs/metrics.md.
func Markdown() string {
	var b strings.Builder
	b.WriteString(`# slowrank's self-metrics

Generated from ` + "`selfmetrics/table.go`" + ` by ` + "`go test ./selfmetrics/ -update`" + `: do not edit.

Every counter and gauge that the agent, the injection library (summed by the
agent), the outputs and the aggregator keep about themselves. The same
instruments leave over OTLP (to the Collector, whose Prometheus exporter
serves them) and on the agent's ` + "`/metrics`" + `. The key is the name in
` + "`slowrank status`" + ` (its ` + "`counters`" + ` map) and in the agent's last log line; a
key ending in ` + "`*`" + ` is a prefix whose rest becomes the attribute in
brackets. Counters of a running component are exported from 0. The
detector's results (` + "`slowrank.step.duration`" + `, ` + "`slowrank.phase.duration`" + `,
` + "`slowrank.deviation`" + `, ` + "`slowrank.straggler`" + `, ` + "`slowrank.state`" + `,
` + "`slowrank.verdicts`" + `, ` + "`slowrank.verdict.latency`" + `) are described in
` + "`otel/export/doc.go`" + `.

The per-rank results (step and phase durations, deviation, state,
straggler) also carry the rank's placement under dcgm-exporter's label
names, each only when known: ` + "`UUID`" + `, ` + "`gpu`" + ` (NVML index), ` + "`pci_bus_id`" + `,
` + "`Hostname`" + `, ` + "`pod`" + `, ` + "`namespace`" + `, ` + "`container`" + ` and ` + "`hpc_job`" + ` (Slurm job
id). They are fixed per rank process, so they add no series;
[deploy.md](deploy.md#25-joining-with-dcgm-exporter) joins them with
dcgm-exporter's series. The self-metrics above carry none of them.

| OpenTelemetry name | Prometheus name | kind | unit | description | key → attributes |
|---|---|---|---|---|---|
`)
	for _, m := range Table {
		var ss []string
		for _, s := range m.Series {
			x := "`" + s.Key + "`"
			var as []string
			for i := 0; i+1 < len(s.Attrs); i += 2 {
				as = append(as, s.Attrs[i]+"="+s.Attrs[i+1])
			}
			if s.Suffix != "" {
				as = append(as, s.Suffix+"=…")
			}
			if len(as) > 0 {
				x += " → " + strings.Join(as, ",")
			}
			if s.Scale != 0 {
				x += fmt.Sprintf(" (×%g)", s.Scale)
			}
			if s.Component != "" && s.Component != m.Component {
				x += " (" + s.Component + ")"
			}
			ss = append(ss, x)
		}
		fmt.Fprintf(&b, "| `%s` | `%s` | %s | `%s` | %s (%s) | %s |\n", m.Name, PromName(m), m.Kind, m.Unit,
			strings.ReplaceAll(m.Desc, "|", `\|`), m.Component, strings.Join(ss, "<br>"))
	}
	fmt.Fprintf(&b, "| `%s` | `%s` | counter | `{event}` | Keys that the table does not declare, by name (a bug: tests fail on it). | any other key → name=KEY |\n",
		Undeclared, PromName(Metric{Name: Undeclared, Kind: Counter, Unit: "{event}"}))
	return b.String()
}
