// Package selfmetrics declares, once, every counter and gauge that slowrank
// keeps about itself — the agent's health counters (events read and lost,
// attach failures, discovery, the correlator's and the detector's losses),
// the BPF probe counts, the injection library's own statistics (cupti_lib_*),
// the duty-cycle and overhead gauges, the JSONL and OTLP outputs, the fact
// forwarder and the aggregator — and turns them into OpenTelemetry
// instruments.
//
// # The table
//
// Table (table.go) lists Metrics: an OpenTelemetry name (dotted, per the
// OTel metric naming conventions: no unit or _total in the name), a Kind
// (Counter: monotonic sum; Gauge), a UCUM unit ("s", "By", "1", or an
// annotation such as "{record}") and a description. Each metric lists its
// Series: the key under which a component reports the value (the key of
// the agent's `status` counters map, e.g. "ringbuf_lost"), the fixed
// attributes that key stands for (reason="ringbuf_full") and a scale (ns →
// s). A key ending in "*" is a prefix: the rest of the key becomes the value
// of the series' Suffix attribute (probe_ncclAllReduce → probe="ncclAllReduce").
// Nothing else in slowrank names a metric: OTLP (export.New) and the agent's
// /metrics (the OpenTelemetry Prometheus exporter reading the same
// MeterProvider) export exactly these instruments; the self-metrics section
// of docs/metrics.md is generated from the table (Markdown; go generate
// ./otel/export/ writes the file, with the detector's result metrics).
//
// # Sources
//
// A Source reports values by key (Observe). Register creates the
// instruments and one callback that, at each collection, asks every source
// for its values and observes each under its series. Every declared
// counter series of a running component (Source.Component) is observed —
// from 0 when the source has not reported it yet — so that a rate or an
// alert over a drop counter has a series before the first drop. A key that
// the table does not declare is still exported, as
// slowrank.component.events{name=KEY} (nothing is dropped silently), and
// tests fail on it.
//
// # Concurrency
//
// Register's callback runs on the metric SDK's reader goroutines; sources
// must be quick and safe for concurrent use. The table is read-only.
package selfmetrics
