package wire

import (
	"encoding/json"
	"time"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/plog"

	"github.com/slowrank/slowrank/detector"
)

// EncodeLogs encodes facts as OTLP logs per the schema (doc.go): one
// resource per job (in order of first appearance), topologies before steps.
// host names the sender (a step's own Host, when set, wins); wall maps a
// fact's *_ns onto wall-clock time for the records' timestamps
// (informational: the aggregator never reads them; nil leaves them unset).
// The scope attribute slowrank.sent_mono_ns is set to 0; StampSent sets it.
func EncodeLogs(host string, topos []detector.Topology, steps []detector.Step, wall func(int64) time.Time) plog.Logs {
	ld := plog.NewLogs()
	scopes := map[string]plog.LogRecordSlice{}
	records := func(job string) plog.LogRecordSlice {
		if s, ok := scopes[job]; ok {
			return s
		}
		rl := ld.ResourceLogs().AppendEmpty()
		rl.Resource().Attributes().PutStr("service.name", ServiceName)
		rl.Resource().Attributes().PutStr(AttrJob, job)
		sl := rl.ScopeLogs().AppendEmpty()
		sl.Scope().SetName(ScopeName)
		sl.Scope().Attributes().PutInt(AttrSentMonoNS, 0)
		s := sl.LogRecords()
		scopes[job] = s
		return s
	}
	for i := range topos {
		t := &topos[i]
		body, err := json.Marshal(t)
		if err != nil {
			continue // cannot happen for these types
		}
		lr := records(t.Job).AppendEmpty()
		lr.SetTraceID(RouteTraceID(t.Job))
		lr.SetEventName(EventTopology)
		lr.Body().SetStr(string(body))
		a := lr.Attributes()
		a.PutStr(AttrKind, KindTopology)
		a.PutStr(AttrHost, host)
		a.PutInt(AttrTopo, int64(t.Version))
	}
	for i := range steps {
		s := &steps[i]
		lr := records(s.Job).AppendEmpty()
		appendStepRecord(lr, host, s, wall)
	}
	return ld
}

func appendStepRecord(lr plog.LogRecord, host string, s *detector.Step, wall func(int64) time.Time) {
	lr.SetTraceID(RouteTraceID(s.Job))
	lr.SetEventName(EventStep)
	if wall != nil {
		lr.SetTimestamp(pcommon.NewTimestampFromTime(wall(s.EndNS)))
	}
	a := lr.Attributes()
	a.EnsureCapacity(12 + len(s.Phases))
	a.PutStr(AttrKind, KindStep)
	if s.Host != "" {
		host = s.Host
	}
	a.PutStr(AttrHost, host)
	a.PutInt(AttrRank, int64(s.Rank))
	a.PutInt(AttrStep, s.Step)
	a.PutInt(AttrStartNS, s.StartNS)
	a.PutInt(AttrEndNS, s.EndNS)
	a.PutBool(AttrGPU, s.GPU)
	if s.Topo != 0 {
		a.PutInt(AttrTopo, int64(s.Topo))
	}
	if s.Epoch != 0 {
		a.PutInt(AttrEpoch, int64(s.Epoch))
	}
	if s.Workload != nil {
		if s.Workload.FP != "" {
			a.PutStr(AttrWorkloadFP, s.Workload.FP)
		}
		if s.Workload.Tokens != 0 {
			a.PutInt(AttrWorkloadTokens, s.Workload.Tokens)
		}
	}
	if s.LastArrival != nil {
		a.PutBool(AttrLastArrival, *s.LastArrival)
	}
	if s.ArrivalLagMS != nil {
		a.PutDouble(AttrArrivalLagMS, *s.ArrivalLagMS)
	}
	if s.DeviceLastArrival != nil {
		a.PutBool(AttrDevLast, *s.DeviceLastArrival)
	}
	if s.DeviceArrivalLagMS != nil {
		a.PutDouble(AttrDevLagMS, *s.DeviceArrivalLagMS)
	}
	if s.DeviceCollMS != nil {
		a.PutDouble(AttrDevCollMS, *s.DeviceCollMS)
	}
	for name, v := range s.Phases {
		a.PutDouble(PhaseAttr(name), v)
	}
}

// StampSent sets slowrank.sent_mono_ns on every scope of ld to mono, the
// sender's CLOCK_MONOTONIC now. Call it right before each send attempt.
func StampSent(ld plog.Logs, mono int64) {
	rls := ld.ResourceLogs()
	for i := 0; i < rls.Len(); i++ {
		sls := rls.At(i).ScopeLogs()
		for j := 0; j < sls.Len(); j++ {
			sls.At(j).Scope().Attributes().PutInt(AttrSentMonoNS, mono)
		}
	}
}
