package export

import (
	"fmt"
	"strings"

	"github.com/slowrank/slowrank/detector"
)

//go:generate go run ./internal/metricsdoc ../../docs/metrics.md

// Result is one of the detector's result metrics, declared once: the
// instruments (metrics.go) take their name, unit and description from it,
// and docs/metrics.md (MetricsDoc) lists it. slowrank's own health metrics
// are selfmetrics.Table.
type Result struct {
	Name string
	Kind string // "histogram", "gauge" or "counter"
	// Unit is UCUM, "" for none: the Prometheus name depends on it (PromName),
	// and the alert rules and the dashboard query those names.
	Unit string
	Desc string
	// Attrs are the data points' attribute keys, besides the rank's
	// placement labels where Placed.
	Attrs  []string
	Placed bool
}

// Results are the detector's result metrics, in documentation order.
var Results = []Result{
	{Name: MetricStepDuration, Kind: "histogram", Unit: "ms", Placed: true,
		Desc: "Wall time of a training step per rank.", Attrs: []string{string(AttrJob), string(KeyRank)}},
	{Name: MetricPhaseDuration, Kind: "histogram", Unit: "ms", Placed: true,
		Desc: "Time of a phase within a training step per rank.", Attrs: []string{string(AttrJob), string(KeyRank), string(KeyPhase)}},
	{Name: MetricDeviation, Kind: "gauge", Placed: true,
		Desc: "value/reference - 1 of the latest verdict per rank and phase.", Attrs: []string{string(AttrJob), string(KeyRank), string(KeyPhase)}},
	{Name: MetricStraggler, Kind: "gauge", Placed: true,
		Desc: "1 while the rank holds an active straggler alert for the phase, else 0.", Attrs: []string{string(AttrJob), string(KeyRank), string(KeyPhase), string(KeyHint)}},
	{Name: MetricState, Kind: "gauge", Placed: true,
		Desc: "Verdict state: " + stateCodes() + ".", Attrs: []string{string(AttrJob), string(KeyRank), string(KeyPhase)}},
	{Name: MetricVerdicts, Kind: "counter",
		Desc: "Detector verdicts by state.", Attrs: []string{string(AttrJob), string(KeyState), string(KeyPhase)}},
	{Name: MetricVerdictLatency, Kind: "histogram", Unit: "s",
		Desc: "From the end of the last step of a window to the export of its verdicts.", Attrs: []string{string(AttrJob)}},
}

// result returns the declaration of the result metric name (a name
// without one gets no unit and no description: TestResultsDeclareEveryInstrument
// fails on it).
func result(name string) Result {
	for _, r := range Results {
		if r.Name == name {
			return r
		}
	}
	return Result{Name: name}
}

// PromName is the Prometheus name that OpenTelemetry's Prometheus
// translation (the agent's /metrics, the Collector's prometheus exporter)
// gives r: dots become underscores, the unit a suffix, a counter _total.
func (r Result) PromName() string {
	n := strings.ReplaceAll(r.Name, ".", "_")
	switch r.Unit {
	case "ms":
		n += "_milliseconds"
	case "s":
		n += "_seconds"
	}
	if r.Kind == "counter" {
		n += "_total"
	}
	return n
}

// State is one value of the slowrank.state gauge.
type State struct {
	Name string // the verdict's state (detector.State*)
	Code int64
	// Meaning is what the state says, for docs/metrics.md.
	Meaning string
}

// States are the codes of the slowrank.state gauge, in code order. The
// alert rules (deploy/prometheus/slowrank-rules.yaml) compare the gauge
// with these numbers: never renumber one.
var States = []State{
	{detector.StateOK, 0, "the rank's phase is within the threshold of its reference; a series that a settled window's verdicts do not name returns to 0 unless it holds an alert"},
	{detector.StateRecovered, 1, "an alerted rank's phase is back within the threshold: the alert ended"},
	{detector.StateUncertain, 2, "the rank could not be judged in the window (too few comparable ranks, a phase its peers measured and it did not, no evidence of exposure); an alert is kept"},
	{detector.StateCandidate, 3, "the window is slow; not yet --consecutive slow windows in a row"},
	{detector.StateStraggler, 4, "--consecutive slow windows in a row: the straggler alert (slowrank.straggler is 1)"},
}

// stateCodes lists States as "ok 0, recovered 1, ...".
func stateCodes() string {
	var b strings.Builder
	for i, s := range States {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %d", s.Name, s.Code)
	}
	return b.String()
}

// StateCode is the value of the slowrank.state gauge for a verdict's
// state (States), -1 for an unknown state.
func StateCode(state string) int64 {
	for _, s := range States {
		if s.Name == state {
			return s.Code
		}
	}
	return -1
}
