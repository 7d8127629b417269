// Package wire is the schema in which agents hand their step and topology
// facts to `slowrank aggregate`: OTLP log records, one per fact. It holds
// the whole contract in one place: the names (schema.go), the encoder the
// forwarder sends with (EncodeLogs, StampSent), and the strict decoder and
// validation the aggregator receives with (DecodeLogs, and DecodeTraces for
// the same step fields on train.step spans), bounded by Limits. It imports
// detector for the fact types and pdata for the OTLP types, nothing else:
// the forwarder's transport (otel/forward) and the aggregator (aggregate)
// import it, the OTel export (export) takes its span attribute names from
// it.
//
// Agents and aggregators of different versions meet in a fleet: a new
// attribute must be optional (unknown ones are ignored), a new required
// attribute or a changed type is a breaking change. The encoder, the decoder
// and this specification change together; the round-trip tests encode every
// fact kind and decode it back, FuzzDecodeLogs and FuzzDecodeTraces keep the
// decoder total.
//
// # One OTLP log record per fact
//
// Resource attributes: service.name = "slowrank", slowrank.job.id = job
// (string, required; nothing host-specific, so that one resource is one job
// and a collector's loadbalancing exporter routing by resource or by the
// slowrank.job.id attribute keeps a job on one aggregator). Scope: name
// "github.com/slowrank/slowrank/otel/forward" (ScopeName; the name of the
// package that first sent it, kept); attribute slowrank.sent_mono_ns (int) =
// the sender's CLOCK_MONOTONIC when the request left, refreshed on every
// retry (optional; absent means age 0). Record: trace_id =
// RouteTraceID(job) (a per-job constant that names no trace; older
// loadbalancing exporters route logs by trace id only), event_name
// slowrank.step or slowrank.topology, on step records a timestamp (the
// step's end in wall time; informational, never read), and the attributes:
//
//	slowrank.kind            string  "step" | "topology"           required
//	slowrank.host            string  the sending host               required
//	slowrank.job.id          string  if present, must equal the resource's
//	step records:
//	slowrank.rank            int     0 ≤ rank < 2^24               required
//	slowrank.step            int     ≥ 0                            required
//	slowrank.start_ns        int     sender's CLOCK_MONOTONIC       required
//	slowrank.end_ns          int     ≥ start_ns, ≤ start + 24 h, ≤ sent_mono_ns
//	slowrank.phase.<p>_ms    double  one per measured phase (p: [a-z0-9_]{1,32},
//	                                 at most 16; finite, ≥ 0); absent = not measured
//	slowrank.gpu             bool    device records present
//	slowrank.topology.version int    the sender's topology version of the step
//	slowrank.epoch           int     the agent's attach epoch
//	slowrank.workload.fp     string  workload fingerprint
//	slowrank.workload.tokens int     ≥ 0
//	slowrank.last_arrival    bool    last at the step's collectives
//	slowrank.arrival_lag_ms  double  ≥ 0
//	slowrank.device_last_arrival bool    its GPU last at the step's collectives
//	slowrank.device_arrival_lag_ms double ≥ 0
//	slowrank.device_coll_ms  double  ≥ 0, the step's collectives' GPU time
//	topology records: body = the topology fact of DESIGN.md 5.1 as a JSON
//	string (job equal to the resource's; a rank's optional placement, k8s,
//	container_id, slurm and gpu, as there); slowrank.topology.version, if
//	present, equal to its version.
//
// A step's slowrank.host, when the step names one, is its own host; the
// sender's otherwise. A step record's end_ns may be at most MaxFactAge
// (1 h) before its sent_mono_ns.
//
// # Validation
//
// Validation is strict and per record: a wrong type, a missing required
// attribute, a value out of range, a key given twice or a record beyond the
// limits rejects that record (counted in Decoded.Rejected, and reported to
// the sender as OTLP partial success with the first reason); other records
// of the request are kept. Unknown attributes are ignored and records
// without slowrank.kind (or with a kind this version does not know) are
// ignored and counted, so the schema can grow. Strings (job, host,
// fingerprint, a topology's rank hosts, group ids and placement fields) are
// 1..MaxString bytes of valid UTF-8 without control characters; a
// placement's GPU index is in [0, 2^16). Limits bound each request:
// records, attributes per record, string lengths, phases per step, and a
// topology's bytes, groups, and ranks plus group members.
//
// # train.step spans
//
// The same step fields are also accepted from train.step spans (OTLP
// traces, as the OTel export writes them: export/spans.go takes its
// attribute names from here), whose timestamps give the duration; job and
// host fall back to the resource's slowrank.job.id and host.name. Spans
// carry no send time: the aggregator places them at their receive time.
// Other spans are ignored.
//
// # Concurrency
//
// Every function is safe for concurrent use; the decoders share no state.
package wire
