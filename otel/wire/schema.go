package wire

import (
	"crypto/sha256"

	"go.opentelemetry.io/collector/pdata/pcommon"

	"github.com/slowrank/slowrank/detector"
)

// The names of the schema (doc.go). They are a public contract: agents and
// aggregators of different versions meet in a fleet.
const (
	// ScopeName is the instrumentation scope of the forwarded records. It
	// names the package that first sent them and stays as it is.
	ScopeName = "github.com/slowrank/slowrank/otel/forward"
	// ServiceName is the resource's service.name.
	ServiceName = "slowrank"
	// EventStep and EventTopology are the records' event_name.
	EventStep     = "slowrank.step"
	EventTopology = "slowrank.topology"
	// KindStep and KindTopology are the values of AttrKind.
	KindStep     = "step"
	KindTopology = "topology"
	// SpanStep is the name of the train.step spans that the OTel export
	// writes and DecodeTraces reads.
	SpanStep = "train.step"
)

// Attribute keys. The step fields have the same keys on forwarded records
// and on train.step spans; AttrKind, AttrSentMonoNS, AttrStartNS and
// AttrEndNS are the forwarded records' own.
const (
	AttrKind           = "slowrank.kind"
	AttrSentMonoNS     = "slowrank.sent_mono_ns"
	AttrJob            = "slowrank.job.id"
	AttrHost           = "slowrank.host"
	AttrRank           = "slowrank.rank"
	AttrStep           = "slowrank.step"
	AttrStartNS        = "slowrank.start_ns"
	AttrEndNS          = "slowrank.end_ns"
	AttrGPU            = "slowrank.gpu"
	AttrTopo           = "slowrank.topology.version"
	AttrEpoch          = "slowrank.epoch"
	AttrWorkloadFP     = "slowrank.workload.fp"
	AttrWorkloadTokens = "slowrank.workload.tokens"
	AttrLastArrival    = "slowrank.last_arrival"
	AttrArrivalLagMS   = "slowrank.arrival_lag_ms"
	AttrDevLast        = "slowrank.device_last_arrival"
	AttrDevLagMS       = "slowrank.device_arrival_lag_ms"
	AttrDevCollMS      = "slowrank.device_coll_ms"
	// PhaseAttrPrefix and PhaseAttrSuffix frame a phase value attribute:
	// slowrank.phase.<name>_ms.
	PhaseAttrPrefix = "slowrank.phase."
	PhaseAttrSuffix = "_ms"
)

// PhaseAttr is the attribute key of a phase value: slowrank.phase.<name>_ms.
func PhaseAttr(phase string) string {
	if k, ok := phaseKeys[phase]; ok {
		return k
	}
	return PhaseAttrPrefix + phase + PhaseAttrSuffix
}

// phaseKeys spares the known phases an allocation per fact.
var phaseKeys = func() map[string]string {
	m := map[string]string{}
	for _, p := range []string{detector.PhaseStep, detector.PhaseCompute, detector.PhaseHost, detector.PhaseSyncWait,
		detector.PhaseComm, detector.PhaseExposedComm, detector.PhaseCollWait, detector.PhaseIdle,
		detector.PhaseAttention, detector.PhaseMoE} {
		m[p] = PhaseAttrPrefix + p + PhaseAttrSuffix
	}
	return m
}()

// RouteTraceID is the trace id every forwarded record of job carries: the
// first 16 bytes of SHA-256("slowrank/" + job + "/route"). It names no
// trace; it makes a collector's loadbalancing exporter, whose log routing in
// some versions only looks at the trace id, keep a job on one aggregator.
func RouteTraceID(job string) pcommon.TraceID {
	sum := sha256.Sum256([]byte("slowrank/" + job + "/route"))
	var id pcommon.TraceID
	copy(id[:], sum[:16])
	return id
}
