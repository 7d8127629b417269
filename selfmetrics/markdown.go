package selfmetrics

import (
	"fmt"
	"strings"
)

// Markdown renders Table as the self-metrics section of docs/metrics.md
// (otel/export's MetricsDoc writes the file around it).
func Markdown() string {
	var b strings.Builder
	b.WriteString(`## Self-metrics

Every counter and gauge that the agent, the injection library (summed by the
agent), the outputs and the aggregator keep about themselves, from
` + "`selfmetrics/table.go`" + `. The key is the name in ` + "`slowrank status`" + ` (its
` + "`counters`" + ` map) and in the agent's last log line; a key ending in ` + "`*`" + ` is a
prefix whose rest becomes the attribute in brackets. Counters of a running
component are exported from 0. The self-metrics carry none of the rank
placement labels.

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
