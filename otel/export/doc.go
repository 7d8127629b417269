// Package export exports slowrank's results through OpenTelemetry: step
// facts become train.step spans (one trace per training step, every rank
// side by side), verdicts become span events, attributes and gauges, and the
// agent's own health becomes metrics; it also owns the JSONL sinks for facts
// and verdicts (JSONLWriter); the agent's fact forwarder to an aggregator
// is the sibling package otel/forward. It imports detector for the fact and verdict
// types, wire for the step attribute names that train.step spans share with
// the fact wire schema, and selfmetrics, and knows nothing of bpf, cupti or
// agent: other components' counters and gauges come in as
// selfmetrics.Source (Config.Self), under the keys that selfmetrics.Table
// declares. Its name leaves "otel" to the upstream API
// (go.opentelemetry.io/otel), which needs no alias next to it; the
// instrumentation scope of what it exports is still
// "github.com/slowrank/slowrank/otel" (ScopeName), a name the back ends see.
//
// # Setup
//
// New reads the standard variables (OTEL_EXPORTER_OTLP_ENDPOINT, _PROTOCOL
// grpc|http/protobuf, _HEADERS, _INSECURE, _TIMEOUT, their _TRACES_ and
// _METRICS_ forms, OTEL_TRACES_EXPORTER / OTEL_METRICS_EXPORTER
// otlp|console|none, OTEL_METRIC_EXPORT_INTERVAL, OTEL_RESOURCE_ATTRIBUTES,
// OTEL_SERVICE_NAME); explicit Config fields override them. The resource
// carries service.name=slowrank, service.version, host.name, process.pid and
// slowrank.job.id: it describes the exporter (the agent or the aggregator),
// whose process.pid it is, not a rank.
//
// # Rank placement
//
// Where each rank runs comes from the job's topology (RecordTopology,
// detector.Placement) and goes on the rank's data, not on the resource: one
// agent exports every rank of its node. train.step spans get the
// semantic-convention attributes k8s.pod.name, k8s.pod.uid,
// k8s.namespace.name, k8s.container.name, container.id, host.name (the
// rank's host) and process.pid (the rank's PID as the agent sees it), and
// slowrank.slurm.job_id, slowrank.slurm.step_id, slowrank.device.uuid,
// slowrank.device.index and slowrank.device.pci_bus_id where semantic
// conventions have no name; each only when known. The per-rank metrics
// (slowrank.step.duration, slowrank.phase.duration, slowrank.deviation,
// slowrank.state, slowrank.straggler) get dcgm-exporter's label names and
// value forms instead, UUID, gpu, pci_bus_id, Hostname, pod, namespace,
// container and hpc_job (placement.go), so that PromQL joins them with its
// series on (UUID). They are fixed per rank process: no new series beyond
// the per-rank ones, except that a rank whose GPU becomes known after its
// first steps starts new histogram series. Spans leave through a bounded, counting queue (the SDK's
// BatchSpanProcessor would drop silently); metrics through an OTLP periodic
// reader. Export errors go to the process-wide OpenTelemetry error handler,
// which New replaces with one that counts them (slowrank.export.errors) and
// logs at most one every 10 s: nothing here crashes or blocks the caller on
// the network. Shutdown(ctx) flushes both signals within ctx's deadline.
//
// # Trace and span ids
//
// The trace of (job, step) has id SHA-256("slowrank/"+job+"/"+step)[:16]
// (TraceID); the train.step span of a rank has id
// SHA-256("slowrank/"+job+"/"+step+"/"+rank)[:8] (SpanID), its phase.<name>
// children SHA-256(...+"/"+phase)[:8]. Agents on different hosts therefore
// put their ranks into the same trace without talking. The ids are set by a
// custom SDK IDGenerator that takes them from the context (withIDs), so each
// train.step span is a genuine root span of the shared trace: no synthetic
// remote parent that Jaeger would report as missing. Timestamps are explicit
// (trace.WithTimestamp), mapped from the facts' CLOCK_MONOTONIC ns by
// Config.MonoToWall. Phase spans are bars laid out from the step start with
// the phase's total length (phases overlap on a GPU, so they are not
// intervals); the slow phase's bar has status Error.
//
// # Export policy
//
// RecordStep records the duration histograms at once and buffers the fact
// under (job, window) — the window index comes from the caller, computed by
// the detector's rule — until SettleWindow brings that window's verdicts.
// Then, within Policy.MaxSpansPerWindow spans and in this priority:
//   - every step of a rank with a non-ok verdict (full span tree, verdict
//     events, slowrank.state and the verdict's attributes; Error status on an
//     active alert, so tag search slowrank.state=straggler finds it);
//   - every rank of each step in which some rank holds an alert (the trace
//     compares them side by side);
//   - every rank of the baseline steps: the low 64 bits of TraceID(job,
//     step) modulo Policy.SampleEvery (default 20) equal 0, a rule that
//     depends on (job, step) only, so all hosts sample the same steps.
//
// Settling a window settles every older buffered window of the job (they
// can get no verdicts any more); a window SettleLag windows behind the
// newest fact is settled as baseline; late facts of recently settled windows
// follow the kept decision. The buffer holds at most Policy.MaxBufferedSteps
// facts and evicts whole oldest windows. Every drop is counted by reason in
// slowrank.export.dropped{signal,reason,unit} and in Stats.
//
// # Metrics
//
// Histograms slowrank.step.duration and slowrank.phase.duration (ms;
// slowrank.job.id, rank, phase, and the rank placement labels), gauges slowrank.deviation,
// slowrank.straggler (1 while an alert is active; hint) and slowrank.state
// (StateCode), the counter slowrank.verdicts{state}, and the histogram
// slowrank.verdict.latency (s): from the end of the window's last step
// (CLOCK_MONOTONIC, Config.NowMono) to the moment its verdicts' spans were
// handed to the exporter. Each is declared once in Results (results.go),
// with its unit, description and attributes, and the codes of
// slowrank.state in States; docs/metrics.md is generated from them and
// selfmetrics.Table (MetricsDoc, go generate). The job is the attribute slowrank.job.id
// (Prometheus label slowrank_job_id), not "job", which Prometheus derives
// from service.name.
//
// Self-metrics: every instrument of selfmetrics.Table, fed by Config.Self,
// the exporter's own counters (Counters: slowrank.export.*) and the
// process' CPU seconds and RSS (ProcessSource, /proc/self). Each reader of
// the one MeterProvider sees the same instruments: the OTLP periodic reader
// and Config.MetricReaders (the agent's /metrics, an OpenTelemetry
// Prometheus exporter), which keep the provider alive with Metrics "none".
//
// # Concurrency
//
// All Exporter and JSONLWriter methods are safe for concurrent use. The
// Exporter runs one span-building goroutine and one export goroutine per
// span exporter, plus the metric SDK's reader goroutine; JSONLWriter runs one
// writer goroutine. Shutdown / Close end them all.
//
// # Requirements
//
// None of the kernel or the GPU. CPU and RSS come from /proc/self; without
// it those two metrics are absent.
package export
