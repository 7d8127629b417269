// Package aggregate is slowrank's multi-host detector: an OTLP receiver
// (`slowrank aggregate`) that takes the step and topology facts every
// agent forwards (forward.Forwarder, `slowrank agent --aggregator ADDR`), runs
// one detector across all ranks of each job, and hands verdicts to the same
// sinks as an agent (JSONL, OpenTelemetry). It owns the merging of the
// hosts' topologies (one merged, versioned topology per job), the timeline
// on which windows are cut, and the receiver's security limits; the wire
// schema, its decoding and its validation are package wire's. It imports
// detector and wire (and internal/certfile, which reloads a renewed TLS
// certificate); nothing in slowrank imports it but cmd.
//
// # Wire schema
//
// The facts arrive as OTLP log records (or as train.step spans) in the
// schema of package wire, which specifies, encodes, decodes and validates
// it: the receiver decodes every request with wire.DecodeLogs or
// wire.DecodeTraces under ServerConfig.Limits and answers the records it
// rejected as OTLP partial success, with the first reason.
//
// # Timeline: windows by receive time minus sender-side age
//
// Hosts' CLOCK_MONOTONIC values have unrelated origins, and wall clocks
// drift; the aggregator trusts no cross-host offset. Every fact is placed on
// the aggregator's own CLOCK_MONOTONIC:
//
//	age     = sent_mono_ns − end_ns        (both from the sender's clock: a duration)
//	end_ns' = receive_mono − age           (the aggregator's clock)
//	start_ns' = end_ns' − (end_ns − start_ns)
//
// and the detector cuts windows by end_ns' exactly as for one host
// (window = floor((end' − t0)/window), t0 the job's first end'). Durations
// (phases, step length) are never touched; only where a step falls is
// decided by the aggregator. Silence is noticed because the aggregator
// advances event time by its own clock every Tick (detector.Advance): a
// window settles at its end plus --lateness even if some host sent nothing,
// and a known rank (one that sent steps before) without
// facts in it is `uncertain` ("no steps in window while N peers measured
// ..."), never slow and never recovered; an active alert is kept
// (alert_active). When the host reports again its ranks are judged again
// from the next window on. Facts that it had queued during the outage get
// their true age, fall into settled windows and are counted late, not
// mixed into the present.
//
// Effect on latency: a verdict leaves at window end + lateness + at most one
// Tick (plus the settle time, see bench/aggregate), the same as in an agent.
// The sender's own delay (correlation, batching, retries) is subtracted, so
// it needs no extra lateness as long as it stays below --lateness (default
// 2 s; the forwarder batches for 200 ms). What is not subtracted is the
// one-way network transit (and a collector's batching, if one sits in
// between), which cannot be measured without synchronised clocks: a slow
// network shifts that host's facts later by its transit time. A constant
// delay shifts all its steps equally: its windows hold as many steps,
// shifted by the delay, and durations are unaffected, so it makes nobody a
// straggler; jitter moves steps near a boundary into the neighbouring
// window, which the per-window median absorbs. A delay beyond the lateness
// allowance makes facts late: the host's ranks become `uncertain` (not
// enough evidence), never slow. Step-index windows were rejected: they
// cannot notice silence (no step, no progress) and need every rank's step
// numbers to agree, which restarts and re-attaches break.
//
// # Topologies from several hosts
//
// Each agent numbers its own topology versions and lists what it sees (its
// ranks; per communicator its local members, all ranks for a world group).
// Per job the aggregator keeps every host's latest topology and builds the
// union: ranks by number, groups by id (members united, type by majority).
// The merged version increases by one whenever the union changes, or the
// set of ranks that sent steps does (at most once per TopologyDebounce,
// default 1 s), and a step's slowrank.topology.version is re-tagged with
// the latest merged version that included the host's version. A host silent
// for HostTTL (default evict-after windows) is forgotten and leaves the
// union. A host's update costs O(its own topology): each rank keeps the
// list of hosts that claim it.
//
// # Security and bounds
//
// The receiver binds 127.0.0.1:4317 unless told otherwise and warns at start
// when it listens beyond loopback without TLS or without a token (or client
// certificates). Optional TLS (certificate and key files), optional client
// certificates (a CA file: every client must present a certificate it
// signed, and may then speak only for the hosts its certificate names,
// DNS names or else its common name: slowrank.host and a topology's rank
// hosts; other records are rejected and counted as impersonation) and an
// optional bearer token (read from a file) required on every request,
// checked before any body is read.
//
// Connections: at most 4096 open and 64 per source address (an IPv6 /64 is
// one source; beyond it a connection is closed at once and counted), 8
// streams each. Accept never waits: with all 4096 open, a newcomer evicts a
// connection (one without a request in progress first) of the source that
// holds the most, if it holds more than the newcomer's source, else it is
// closed at once (both counted), so that filling the slots from many
// addresses delays no agent; headers must arrive within 5 s, an idle connection is
// closed after 30 s, and a request refused for its token, its size, its
// rate or its form is answered and its connection closed (HTTP/2: GOAWAY),
// so that refused clients hold no slot. Bodies: at most 4 MiB (compressed
// and decompressed, gRPC messages too), read whole at 64 KiB/s at least
// after a 5 s grace (slower: 408, closed; the deadline is grace + bytes
// received / rate, so a declared length buys no time) into a buffer
// charged to a memory budget of 256 MiB over all requests being read or
// waiting (beyond it: retryable 503) as the bytes arrive: a request that
// declares 4 MiB and sends nothing holds 64 KiB, a body at most twice what
// it sent, and only then does a request take one of 16 decoding
// slots (waiting up to 5 s, then a retryable refusal): slow senders cannot
// hold the decoders. Decoding is bounded per request (wire.Limits: records,
// attributes, string lengths, phases, topology size).
//
// State is bounded: hosts (65536 overall, 8192 per job, forgotten after
// HostTTL), jobs (the detector configuration's MaxJobs at once; one detector
// judges them all, each job on its own origin and windows, and a job whose
// hosts are all forgotten is finished once its last window has settled on
// time: its summary kept, its state dropped from the detector, its slot
// freed), ranks (MaxRanks per job and 2^19 over all jobs), per host name
// 16 jobs and 1024 ranks, per client (its client certificate, else its
// source address: never a host name it claims, which any client may vary)
// a share of the global bounds: 1/16 of the ranks and of the hosts, 1/4 of
// the jobs and of the queue, stored topology entries (2^23 over all jobs),
// facts waiting for the detector (QueueFacts; beyond it the receiver
// answers a retryable UNAVAILABLE / HTTP 503 and the forwarder backs off).
// A rank gets state only from its steps: the merged topology handed to the
// detector holds the ranks that sent steps (as ranks and as group
// members), so a topology that names a hundred thousand ranks costs the
// topology's size, not rank state. Identical group member lists from many
// hosts (the world group) are stored once. Durations are bounded (window
// and lateness at most a day, HostTTL at most 30 days) so that no sum of
// times overflows.
//
// # Concurrency
//
// Server handlers decode concurrently and call Aggregator.Offer, which
// never blocks. One goroutine (Run) owns the detector, the topology merge
// and the per-host state, and calls the sinks in order.
//
// # Requirements
//
// None of the kernel or the GPU: the aggregator runs anywhere Go does.
package aggregate
