package export

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"math/rand/v2"
	"strconv"

	"go.opentelemetry.io/otel/trace"
)

// TraceID returns the trace id of (job, step): the first 16 bytes of
// SHA-256("slowrank/" + job + "/" + step), step in decimal. Agents on
// different hosts compute the same id without talking to each other, so every
// rank's train.step span of one step lands in one trace.
func TraceID(job string, step int64) trace.TraceID {
	sum := sha256.Sum256([]byte(stepKey(job, step)))
	var id trace.TraceID
	copy(id[:], sum[:16])
	if !id.IsValid() { // all zero: astronomically unlikely, but never invalid
		id[15] = 1
	}
	return id
}

// SpanID returns the span id of the train.step span of (job, step, rank):
// the first 8 bytes of SHA-256("slowrank/" + job + "/" + step + "/" + rank).
// Re-exporting the same fact yields the same span, which back ends dedupe.
func SpanID(job string, step int64, rank int) trace.SpanID {
	return spanIDOf(stepKey(job, step) + "/" + strconv.Itoa(rank))
}

// PhaseSpanID returns the span id of the phase.<phase> child span of
// (job, step, rank): SHA-256 of the step span's key + "/" + phase.
func PhaseSpanID(job string, step int64, rank int, phase string) trace.SpanID {
	return spanIDOf(stepKey(job, step) + "/" + strconv.Itoa(rank) + "/" + phase)
}

func stepKey(job string, step int64) string {
	return "slowrank/" + job + "/" + strconv.FormatInt(step, 10)
}

func spanIDOf(key string) trace.SpanID {
	sum := sha256.Sum256([]byte(key))
	var id trace.SpanID
	copy(id[:], sum[:8])
	if !id.IsValid() {
		id[7] = 1
	}
	return id
}

// sampled reports whether step belongs to the baseline sample: the low 64
// bits of its trace id modulo every. It depends on (job, step) only, so every
// rank of a sampled step is exported, on every host.
func sampled(id trace.TraceID, every int) bool {
	if every <= 0 {
		return false
	}
	return binary.BigEndian.Uint64(id[8:])%uint64(every) == 0
}

// idKey carries the ids that the next span started with this context must
// get. See idGenerator.
type idKey struct{}

type wantIDs struct {
	trace trace.TraceID
	span  trace.SpanID
}

func withIDs(ctx context.Context, t trace.TraceID, s trace.SpanID) context.Context {
	return context.WithValue(ctx, idKey{}, wantIDs{trace: t, span: s})
}

// idGenerator is the SDK IDGenerator of slowrank's tracer provider. A span
// started with a context from withIDs gets exactly those ids: a root span
// (no parent in the context) takes the trace and span id, a child span whose
// parent is in that trace takes the span id. Anything else gets random ids,
// as with the SDK default.
//
// This is the clean way to get deterministic ids with the SDK: train.step
// spans are real root spans of the (job, step) trace (no fake remote parent
// that Jaeger would flag as missing), and their children are ordinary SDK
// children.
type idGenerator struct{}

func (idGenerator) NewIDs(ctx context.Context) (trace.TraceID, trace.SpanID) {
	if w, ok := ctx.Value(idKey{}).(wantIDs); ok && w.trace.IsValid() && w.span.IsValid() {
		return w.trace, w.span
	}
	var t trace.TraceID
	var s trace.SpanID
	for !t.IsValid() {
		binary.BigEndian.PutUint64(t[:8], rand.Uint64())
		binary.BigEndian.PutUint64(t[8:], rand.Uint64())
	}
	for !s.IsValid() {
		binary.BigEndian.PutUint64(s[:], rand.Uint64())
	}
	return t, s
}

func (idGenerator) NewSpanID(ctx context.Context, traceID trace.TraceID) trace.SpanID {
	if w, ok := ctx.Value(idKey{}).(wantIDs); ok && w.trace == traceID && w.span.IsValid() {
		return w.span
	}
	var s trace.SpanID
	for !s.IsValid() {
		binary.BigEndian.PutUint64(s[:], rand.Uint64())
	}
	return s
}
