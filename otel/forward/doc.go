// Package forward is the agent's transport of its step and topology facts
// to `slowrank aggregate` (`slowrank agent --aggregator ADDR`): a Forwarder
// is one more sink of the agent's pipeline that queues facts (bounded;
// never blocks the caller), batches them, encodes them in the fact wire
// schema (package wire: EncodeLogs, StampSent before every attempt) and
// sends them as OTLP logs over gRPC or HTTP, gzip'ed by default, with an
// optional bearer token and TLS. It retries retryable failures with
// jittered exponential back-off, reconnects after a failure, re-sends every
// job's latest topology periodically and after a recovery, and counts
// everything it drops, by reason (Stats; Counters gives them under their
// selfmetrics keys, forward_*).
//
// It imports detector for the fact types and wire for their encoding,
// nothing else of slowrank: the schema is wire's, the decoding the
// aggregator's.
//
// # Concurrency
//
// All Forwarder methods are safe for concurrent use. A Forwarder runs one
// sending goroutine; Close ends it.
package forward
