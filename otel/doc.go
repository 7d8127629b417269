// Package otel is the export side of slowrank, in three packages below it:
// export (OTel traces and metrics, JSONL sinks), forward (the agent's fact
// forwarder to an aggregator) and wire (the agent → aggregator fact
// schema, which aggregate decodes). None is named otel, so the upstream
// API (go.opentelemetry.io/otel) needs no alias next to them. Dependencies
// point here, never back: the export side imports detector, selfmetrics
// and internal/monoclock only, and no capture package (agent, bpf, cupti).
package otel
