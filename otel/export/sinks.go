package export

import "github.com/slowrank/slowrank/detector"

// The sinks of detector.Sink, which the agent (agent.Sink) and the
// aggregator (aggregate.Sink) both take: three methods, Topology, Step
// (with the fact's window) and Settled; both merge a
// sink's Counters into their own (agent.CounterSource), so every loss shows
// in the metrics and in `slowrank status`. One implementation serves
// `slowrank agent`, `slowrank aggregate` and the benchmarks.

// JSONLSink writes facts and verdicts as JSONL (DESIGN.md 5.1 and 5.2):
// topologies and steps to Facts, verdicts to Verdicts, in the order they
// come. Either writer may be nil: that output is off.
type JSONLSink struct {
	Facts, Verdicts *JSONLWriter
}

// Topology writes t to Facts.
func (j *JSONLSink) Topology(t detector.Topology) {
	if j.Facts != nil {
		j.Facts.Write(t)
	}
}

// Step writes s to Facts.
func (j *JSONLSink) Step(s detector.Step, _ int64) {
	if j.Facts != nil {
		j.Facts.Write(s)
	}
}

// Settled writes the window's verdicts to Verdicts.
func (j *JSONLSink) Settled(_ detector.SettledWindow, vs []detector.Verdict) {
	if j.Verdicts == nil {
		return
	}
	for _, v := range vs {
		j.Verdicts.Write(v)
	}
}

// Counters returns, per open output (facts, verdicts), the lines written
// and lost and whether writing fails now: jsonl_NAME_written,
// jsonl_NAME_lost, jsonl_NAME_write_failing (0 or 1).
func (j *JSONLSink) Counters() map[string]int64 {
	m := map[string]int64{}
	for name, w := range map[string]*JSONLWriter{"facts": j.Facts, "verdicts": j.Verdicts} {
		if w == nil {
			continue
		}
		m["jsonl_"+name+"_written"] = w.Written()
		m["jsonl_"+name+"_lost"] = w.Lost()
		failing := int64(0)
		if w.Err() != nil {
			failing = 1
		}
		m["jsonl_"+name+"_write_failing"] = failing
	}
	return m
}

// OTelSink hands facts and verdicts to an Exporter: RecordTopology,
// RecordStep and SettleWindow, which turns the settled window's buffered
// facts into spans per the export policy (doc.go).
type OTelSink struct {
	Exporter *Exporter
}

// Topology records t (the ranks' placement for spans and metric labels).
func (o OTelSink) Topology(t detector.Topology) { o.Exporter.RecordTopology(t) }

// Step records s under its window.
func (o OTelSink) Step(s detector.Step, window int64) { o.Exporter.RecordStep(s, window) }

// Settled settles w with its verdicts.
func (o OTelSink) Settled(w detector.SettledWindow, vs []detector.Verdict) {
	o.Exporter.SettleWindow(w.Job, w.Index, vs)
}

// Counters returns the exporter's counters (Exporter.Counters: spans
// exported and dropped, ...).
func (o OTelSink) Counters() map[string]int64 { return o.Exporter.Counters() }
