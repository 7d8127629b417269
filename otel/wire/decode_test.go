package wire

import (
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/pdata/plog/plogotlp"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"

	"github.com/slowrank/slowrank/detector"
)

func ptr[T any](v T) *T { return &v }

func sampleStep() detector.Step {
	return detector.Step{
		Kind: detector.KindStep, Job: "j1", Topo: 3, Rank: 5, Step: 120, Host: "h1",
		StartNS: 1_000_000, EndNS: 27_000_000,
		Phases:   map[string]float64{"step": 26, "compute": 21.2, "host": 3.1, "sync_wait": 18},
		GPU:      true,
		Workload: &detector.Workload{FP: "9f2c01aa", Tokens: 8192},
		Epoch:    7, LastArrival: ptr(true), ArrivalLagMS: ptr(1.5),
		DeviceLastArrival: ptr(false), DeviceArrivalLagMS: ptr(0.25), DeviceCollMS: ptr(4.5),
	}
}

func sampleTopo() detector.Topology {
	return detector.Topology{Kind: detector.KindTopology, Job: "j1", Version: 2,
		Ranks:  []detector.RankInfo{{Rank: 4, Host: "h1", LocalRank: 0, PID: 42}, {Rank: 5, Host: "h1", LocalRank: 1, PID: 43}},
		Groups: []detector.Group{{ID: "w", Type: "world", Ranks: []int{0, 1, 2, 3, 4, 5}}}}
}

func TestDecodeLogsRoundTrip(t *testing.T) {
	s, topo := sampleStep(), sampleTopo()
	ld := EncodeLogs("h1", []detector.Topology{topo}, []detector.Step{s}, func(ns int64) time.Time { return time.Unix(0, ns) })
	StampSent(ld, 30_000_000)
	// Through the wire format, as a receiver sees it.
	b, err := plogotlp.NewExportRequestFromLogs(ld).MarshalProto()
	if err != nil {
		t.Fatal(err)
	}
	req := plogotlp.NewExportRequest()
	if err := req.UnmarshalProto(b); err != nil {
		t.Fatal(err)
	}
	d := DecodeLogs(req.Logs(), Limits{})
	if d.Rejected != 0 || d.Ignored != 0 || len(d.Facts) != 2 {
		t.Fatalf("decoded %+v", d)
	}
	if d.Facts[0].Topology == nil || !reflect.DeepEqual(*d.Facts[0].Topology, topo) {
		t.Errorf("topology: got %+v, want %+v", d.Facts[0].Topology, topo)
	}
	got := d.Facts[1]
	if got.Host != "h1" || got.SentMono != 30_000_000 || got.Step == nil {
		t.Fatalf("step fact %+v", got)
	}
	if !reflect.DeepEqual(*got.Step, s) {
		t.Errorf("step:\n got %+v\nwant %+v", *got.Step, s)
	}
}

// record builds a logs request with one step record whose attributes are
// those of sampleStep, changed by edit.
func record(edit func(res, scope, attrs pcommon.Map, lr plog.LogRecord)) plog.Logs {
	s := sampleStep()
	ld := EncodeLogs("h1", nil, []detector.Step{s}, nil)
	StampSent(ld, 30_000_000)
	rl := ld.ResourceLogs().At(0)
	sl := rl.ScopeLogs().At(0)
	lr := sl.LogRecords().At(0)
	edit(rl.Resource().Attributes(), sl.Scope().Attributes(), lr.Attributes(), lr)
	return ld
}

func TestDecodeLogsRejects(t *testing.T) {
	cases := []struct {
		name string
		edit func(res, scope, attrs pcommon.Map, lr plog.LogRecord)
		want string
	}{
		{"no job", func(res, _, _ pcommon.Map, _ plog.LogRecord) { res.Remove("slowrank.job.id") }, "resource without slowrank.job.id"},
		{"int job", func(res, _, _ pcommon.Map, _ plog.LogRecord) { res.PutInt("slowrank.job.id", 3) }, "must be a string"},
		{"empty job", func(res, _, _ pcommon.Map, _ plog.LogRecord) { res.PutStr("slowrank.job.id", "") }, "is empty"},
		{"control char", func(res, _, _ pcommon.Map, _ plog.LogRecord) { res.PutStr("slowrank.job.id", "a\nb") }, "control character"},
		{"long job", func(res, _, _ pcommon.Map, _ plog.LogRecord) {
			res.PutStr("slowrank.job.id", strings.Repeat("x", 300))
		}, "300 bytes"},
		{"bad utf8", func(_, _, a pcommon.Map, _ plog.LogRecord) { a.PutStr("slowrank.host", "\xff") }, "UTF-8"},
		{"no host", func(_, _, a pcommon.Map, _ plog.LogRecord) { a.Remove("slowrank.host") }, "missing attribute slowrank.host"},
		{"no rank", func(_, _, a pcommon.Map, _ plog.LogRecord) { a.Remove("slowrank.rank") }, "missing attribute slowrank.rank"},
		{"no end", func(_, _, a pcommon.Map, _ plog.LogRecord) { a.Remove("slowrank.end_ns") }, "missing attribute slowrank.end_ns"},
		{"negative rank", func(_, _, a pcommon.Map, _ plog.LogRecord) { a.PutInt("slowrank.rank", -1) }, "out of range"},
		{"huge rank", func(_, _, a pcommon.Map, _ plog.LogRecord) { a.PutInt("slowrank.rank", 1<<30) }, "out of range"},
		{"string rank", func(_, _, a pcommon.Map, _ plog.LogRecord) { a.PutStr("slowrank.rank", "5") }, "must be an int"},
		{"negative step", func(_, _, a pcommon.Map, _ plog.LogRecord) { a.PutInt("slowrank.step", -3) }, "out of range"},
		{"end before start", func(_, _, a pcommon.Map, _ plog.LogRecord) { a.PutInt("slowrank.start_ns", 28_000_000) }, "before start"},
		{"day-long step", func(_, scope, a pcommon.Map, _ plog.LogRecord) {
			a.PutInt("slowrank.start_ns", 0)
			a.PutInt("slowrank.end_ns", 25*3600*1e9)
			scope.PutInt("slowrank.sent_mono_ns", 26*3600*1e9)
		}, "limit 24 h"},
		{"end after send", func(_, scope, _ pcommon.Map, _ plog.LogRecord) { scope.PutInt("slowrank.sent_mono_ns", 1) }, "after slowrank.sent_mono_ns"},
		{"negative sent", func(_, scope, _ pcommon.Map, _ plog.LogRecord) { scope.PutInt("slowrank.sent_mono_ns", -1) }, "must be an int in [0, 2^62)"},
		// One such fact used to wrap the window index and make the job's
		// next facts late.
		{"sent near 2^63", func(_, scope, _ pcommon.Map, _ plog.LogRecord) {
			scope.PutInt("slowrank.sent_mono_ns", math.MaxInt64-5)
		}, "must be an int in [0, 2^62)"},
		{"sent an hour and more after the end", func(_, scope, _ pcommon.Map, _ plog.LogRecord) {
			scope.PutInt("slowrank.sent_mono_ns", 2*3600*1e9)
		}, "at most 1h0m0s"},
		{"NaN phase", func(_, _, a pcommon.Map, _ plog.LogRecord) { a.PutDouble("slowrank.phase.host_ms", math.NaN()) }, "finite"},
		{"negative phase", func(_, _, a pcommon.Map, _ plog.LogRecord) { a.PutDouble("slowrank.phase.host_ms", -1) }, "finite"},
		{"inf phase", func(_, _, a pcommon.Map, _ plog.LogRecord) { a.PutDouble("slowrank.phase.host_ms", math.Inf(1)) }, "finite"},
		{"string phase", func(_, _, a pcommon.Map, _ plog.LogRecord) { a.PutStr("slowrank.phase.host_ms", "3") }, "finite"},
		{"bad phase name", func(_, _, a pcommon.Map, _ plog.LogRecord) { a.PutDouble("slowrank.phase.Host!_ms", 3) }, "name must match"},
		{"too many phases", func(_, _, a pcommon.Map, _ plog.LogRecord) {
			for i := range 20 {
				a.PutDouble("slowrank.phase.p"+string(rune('a'+i))+"_ms", 1)
			}
		}, "more than 16 phases"},
		{"too many attributes", func(_, _, a pcommon.Map, _ plog.LogRecord) {
			for i := range 70 {
				a.PutInt("x."+strings.Repeat("y", i+1), 1)
			}
		}, "attributes (limit 64)"},
		{"bool gpu as int", func(_, _, a pcommon.Map, _ plog.LogRecord) { a.PutInt("slowrank.gpu", 1) }, "must be a bool"},
		{"negative tokens", func(_, _, a pcommon.Map, _ plog.LogRecord) { a.PutInt("slowrank.workload.tokens", -5) }, "out of range"},
		// Two such counts overflowed the detector's median.
		{"tokens near 2^63", func(_, _, a pcommon.Map, _ plog.LogRecord) {
			a.PutInt("slowrank.workload.tokens", math.MaxInt64-1)
		}, "out of range"},
		{"job mismatch", func(_, _, a pcommon.Map, _ plog.LogRecord) { a.PutStr("slowrank.job.id", "other") }, "differs from its resource"},
		{"kind not a string", func(_, _, a pcommon.Map, _ plog.LogRecord) { a.PutInt("slowrank.kind", 1) }, "must be a string"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := DecodeLogs(record(c.edit), Limits{})
			if d.Rejected != 1 || len(d.Facts) != 0 {
				t.Fatalf("want one rejection, got %+v", d)
			}
			if !strings.Contains(d.FirstErr.Error(), c.want) {
				t.Errorf("error %q does not say %q", d.FirstErr, c.want)
			}
		})
	}
}

func TestDecodeLogsDuplicateAttributeOnTheWire(t *testing.T) {
	// pcommon.Map never holds a key twice, but the wire can: OTLP/JSON
	// attributes are a list.
	js := `{"resourceLogs":[{"resource":{"attributes":[{"key":"slowrank.job.id","value":{"stringValue":"j1"}}]},
	 "scopeLogs":[{"logRecords":[{"attributes":[
	  {"key":"slowrank.kind","value":{"stringValue":"step"}},
	  {"key":"slowrank.host","value":{"stringValue":"h1"}},
	  {"key":"slowrank.rank","value":{"intValue":"1"}},
	  {"key":"slowrank.rank","value":{"intValue":"2"}},
	  {"key":"slowrank.step","value":{"intValue":"1"}},
	  {"key":"slowrank.start_ns","value":{"intValue":"1"}},
	  {"key":"slowrank.end_ns","value":{"intValue":"2"}}]}]}]}]}`
	req := plogotlp.NewExportRequest()
	if err := req.UnmarshalJSON([]byte(js)); err != nil {
		t.Fatal(err)
	}
	d := DecodeLogs(req.Logs(), Limits{})
	if d.Rejected != 1 || !strings.Contains(d.FirstErr.Error(), "given twice") {
		t.Fatalf("duplicate key accepted: %+v %v", d, d.FirstErr)
	}
}

func TestDecodeLogsKeepsGoodNeighbours(t *testing.T) {
	s := sampleStep()
	bad := s
	bad.Rank = 6
	ld := EncodeLogs("h1", nil, []detector.Step{s, bad, s}, nil)
	StampSent(ld, 30_000_000)
	lrs := ld.ResourceLogs().At(0).ScopeLogs().At(0).LogRecords()
	lrs.At(1).Attributes().PutDouble("slowrank.phase.host_ms", -1)
	other := lrs.AppendEmpty() // somebody else's log record
	other.Body().SetStr("hello")
	unknown := lrs.AppendEmpty() // a kind from a newer agent
	unknown.Attributes().PutStr("slowrank.kind", "heartbeat")
	d := DecodeLogs(ld, Limits{})
	if len(d.Facts) != 2 || d.Rejected != 1 || d.Ignored != 2 {
		t.Fatalf("facts %d rejected %d ignored %d (%v)", len(d.Facts), d.Rejected, d.Ignored, d.FirstErr)
	}
}

func TestDecodeLogsRecordLimit(t *testing.T) {
	steps := make([]detector.Step, 10)
	for i := range steps {
		steps[i] = sampleStep()
		steps[i].Step = int64(i)
	}
	ld := EncodeLogs("h1", nil, steps, nil)
	d := DecodeLogs(ld, Limits{MaxRecords: 4})
	if len(d.Facts) != 4 || d.Rejected != 6 {
		t.Fatalf("facts %d rejected %d", len(d.Facts), d.Rejected)
	}
}

func TestDecodeTopologyRejects(t *testing.T) {
	cases := []struct {
		name string
		body string
		want string
	}{
		{"not json", "{", "topology body"},
		{"a step", `{"kind":"step","job":"j1","rank":1,"step":1,"end_ns":5,"phases":{}}`, "body is a *detector.Step"},
		{"other job", `{"kind":"topology","job":"j2","version":2}`, "under resource of job"},
		{"negative member", `{"kind":"topology","job":"j1","version":2,"groups":[{"id":"g","type":"dp","ranks":[-1]}]}`, "negative rank"},
		{"huge rank", `{"kind":"topology","job":"j1","version":2,"ranks":[{"rank":99999999,"local_rank":0}]}`, "out of range"},
		{"version mismatch", `{"kind":"topology","job":"j1","version":5}`, "differs from the body's version"},
		{"control character in a pod name", `{"kind":"topology","job":"j1","version":2,"ranks":[{"rank":1,"local_rank":0,"k8s":{"pod_name":"a\u001bb"}}]}`, "k8s.pod_name contains a control character"},
		{"overlong container id", `{"kind":"topology","job":"j1","version":2,"ranks":[{"rank":1,"local_rank":0,"container_id":"` + strings.Repeat("a", 300) + `"}]}`, "container_id is 300 bytes"},
		{"negative gpu index", `{"kind":"topology","job":"j1","version":2,"ranks":[{"rank":1,"local_rank":0,"gpu":{"index":-1,"uuid":"GPU-1"}}]}`, "gpu.index -1 out of range"},
		{"gpu uuid not a string", `{"kind":"topology","job":"j1","version":2,"ranks":[{"rank":1,"local_rank":0,"gpu":{"index":0,"uuid":7}}]}`, "topology body"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ld := EncodeLogs("h1", []detector.Topology{sampleTopo()}, nil, nil)
			ld.ResourceLogs().At(0).ScopeLogs().At(0).LogRecords().At(0).Body().SetStr(c.body)
			d := DecodeLogs(ld, Limits{})
			if d.Rejected != 1 || !strings.Contains(d.FirstErr.Error(), c.want) {
				t.Fatalf("got %+v (%v), want a rejection saying %q", d, d.FirstErr, c.want)
			}
		})
	}
}

func TestDecodeTraces(t *testing.T) {
	td := ptrace.NewTraces()
	rs := td.ResourceSpans().AppendEmpty()
	rs.Resource().Attributes().PutStr("host.name", "h7")
	spans := rs.ScopeSpans().AppendEmpty().Spans()
	sp := spans.AppendEmpty()
	sp.SetName(SpanStep)
	sp.SetStartTimestamp(pcommon.Timestamp(1_000_000_000))
	sp.SetEndTimestamp(pcommon.Timestamp(1_026_000_000))
	a := sp.Attributes()
	a.PutStr("slowrank.job.id", "j1")
	a.PutInt("slowrank.rank", 3)
	a.PutInt("slowrank.step", 9)
	a.PutDouble("slowrank.phase.host_ms", 3.5)
	a.PutStr("slowrank.export", "baseline")
	a.PutStr("slowrank.phase", "host") // the verdict's phase: not a value
	child := spans.AppendEmpty()
	child.SetName("phase.host")
	d := DecodeTraces(td, Limits{})
	if len(d.Facts) != 1 || d.Ignored != 1 || d.Rejected != 0 {
		t.Fatalf("%+v %v", d, d.FirstErr)
	}
	s := d.Facts[0].Step
	if s.Job != "j1" || s.Rank != 3 || s.Step != 9 || s.Host != "h7" || s.EndNS-s.StartNS != 26_000_000 || s.Phases["host"] != 3.5 || len(s.Phases) != 1 {
		t.Fatalf("step %+v", s)
	}
}

// FuzzDecodeLogs feeds arbitrary bytes as an ExportLogsServiceRequest: the
// decoder must never panic, and whatever it accepts must satisfy the
// invariants the detector relies on.
func FuzzDecodeLogs(f *testing.F) {
	s := sampleStep()
	ld := EncodeLogs("h1", []detector.Topology{sampleTopo()}, []detector.Step{s}, nil)
	StampSent(ld, 30_000_000)
	seed, _ := plogotlp.NewExportRequestFromLogs(ld).MarshalProto()
	f.Add(seed)
	f.Add([]byte{})
	f.Add(seed[:len(seed)/2])
	lim := Limits{MaxRecords: 64}
	f.Fuzz(func(t *testing.T, data []byte) {
		req := plogotlp.NewExportRequest()
		if err := req.UnmarshalProto(data); err != nil {
			return
		}
		d := DecodeLogs(req.Logs(), lim)
		if len(d.Facts)+d.Rejected > req.Logs().LogRecordCount() || len(d.Facts) > lim.MaxRecords {
			t.Fatalf("%d facts and %d rejections from %d records", len(d.Facts), d.Rejected, req.Logs().LogRecordCount())
		}
		if d.Rejected > 0 && d.FirstErr == nil {
			t.Fatal("rejection without a reason")
		}
		for _, f := range d.Facts {
			if f.Host == "" || (f.Step == nil) == (f.Topology == nil) {
				t.Fatalf("bad fact %+v", f)
			}
			if st := f.Step; st != nil {
				if st.Job == "" || st.Rank < 0 || st.Rank >= MaxRank || st.Step < 0 || st.EndNS < st.StartNS ||
					st.StartNS < 0 || st.Phases == nil || len(st.Phases) > 16 || (f.SentMono > 0 && f.SentMono < st.EndNS) {
					t.Fatalf("invariant broken: %+v", st)
				}
				for p, v := range st.Phases {
					if !validPhaseName(p) || !(v >= 0) || v > maxPhaseMS {
						t.Fatalf("phase %q = %v", p, v)
					}
				}
			}
			if tp := f.Topology; tp != nil && tp.Job == "" {
				t.Fatalf("topology without job: %+v", tp)
			}
		}
		// Whatever was accepted, the detector takes without error.
		det, _ := detector.New(detector.DefaultConfig())
		for _, f := range d.Facts {
			if f.Step != nil {
				if _, err := det.AddStep(*f.Step); err != nil {
					t.Fatalf("detector rejects an accepted step: %v", err)
				}
			} else if err := det.AddTopology(*f.Topology); err != nil {
				t.Fatalf("detector rejects an accepted topology: %v", err)
			}
		}
	})
}

// stepSpans is a traces request with one train.step span as the agent's
// exporter writes it and one span of another name.
func stepSpans(start, end uint64) ptrace.Traces {
	td := ptrace.NewTraces()
	rs := td.ResourceSpans().AppendEmpty()
	rs.Resource().Attributes().PutStr("host.name", "h7")
	rs.Resource().Attributes().PutStr("slowrank.job.id", "j1")
	spans := rs.ScopeSpans().AppendEmpty().Spans()
	sp := spans.AppendEmpty()
	sp.SetName(SpanStep)
	sp.SetStartTimestamp(pcommon.Timestamp(start))
	sp.SetEndTimestamp(pcommon.Timestamp(end))
	a := sp.Attributes()
	a.PutInt("slowrank.rank", 3)
	a.PutInt("slowrank.step", 9)
	a.PutDouble("slowrank.phase.host_ms", 3.5)
	a.PutInt("slowrank.workload.tokens", 4096)
	spans.AppendEmpty().SetName("phase.host")
	return td
}

// FuzzDecodeTraces feeds arbitrary bytes as an ExportTraceServiceRequest:
// the decoder must never panic, and every step it accepts must satisfy the
// detector's invariants (its seeds are in testdata/fuzz/FuzzDecodeTraces).
func FuzzDecodeTraces(f *testing.F) {
	for _, td := range []ptrace.Traces{stepSpans(1e9, 1.026e9), stepSpans(math.MaxUint64, 1e9), stepSpans(0, math.MaxInt64)} {
		seed, _ := ptraceotlp.NewExportRequestFromTraces(td).MarshalProto()
		f.Add(seed)
	}
	lim := Limits{MaxRecords: 64}
	f.Fuzz(func(t *testing.T, data []byte) {
		req := ptraceotlp.NewExportRequest()
		if err := req.UnmarshalProto(data); err != nil {
			return
		}
		d := DecodeTraces(req.Traces(), lim)
		if len(d.Facts)+d.Rejected+d.Ignored != req.Traces().SpanCount() || len(d.Facts) > lim.MaxRecords {
			t.Fatalf("%d facts, %d rejected, %d ignored of %d spans", len(d.Facts), d.Rejected, d.Ignored, req.Traces().SpanCount())
		}
		if d.Rejected > 0 && d.FirstErr == nil {
			t.Fatal("rejection without a reason")
		}
		det, _ := detector.New(detector.DefaultConfig())
		for _, f := range d.Facts {
			st := f.Step
			if st == nil || f.Topology != nil || f.Host == "" || f.Host != st.Host || st.Job == "" {
				t.Fatalf("bad fact %+v", f)
			}
			if st.Rank < 0 || st.Rank >= MaxRank || st.Step < 0 || st.StartNS < 0 || st.EndNS < st.StartNS ||
				st.EndNS-st.StartNS > maxStepSpanNS || len(st.Phases) > 16 || (st.Workload != nil && st.Workload.Tokens > maxTokens) {
				t.Fatalf("invariant broken: %+v", st)
			}
			// The aggregator places a span at its receive time; its length
			// is what the detector gets from the span.
			placed := *st
			placed.EndNS, placed.StartNS = 1e12, 1e12-(st.EndNS-st.StartNS)
			if _, err := det.AddStep(placed); err != nil {
				t.Fatalf("detector rejects an accepted step: %v", err)
			}
		}
	})
}

// The placement of a rank (pod, container, Slurm step, GPU) crosses the
// wire to the aggregator unchanged, and an older agent's topology without
// one still decodes, with none.
func TestDecodeTopologyPlacement(t *testing.T) {
	placed := sampleTopo()
	placed.Ranks[1].Placement = detector.Placement{
		K8s:         detector.K8sPod{PodName: "llama-worker-0", PodUID: "6f1c0e4a-2b8d-4c7e-9a51-3d2f8b7e1c90", Namespace: "train", ContainerName: "pytorch"},
		ContainerID: "4f3a1d2e9b8c7a6f5e4d3c2b1a0f9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f",
		Slurm:       detector.SlurmStep{JobID: "4711", StepID: "2"},
		GPU:         detector.RankGPU{Index: 3, UUID: "GPU-5b1e3a8c-0d2f-4e6a-8b9c-1a2b3c4d5e6f", PCIBusID: "00000000:3B:00.0"},
	}
	tests := []struct {
		name string
		body string // "" : EncodeLogs' encoding of want
		want detector.Topology
	}{
		{"placed rank next to an unplaced one", "", placed},
		{"older agent", `{"kind":"topology","job":"j1","version":2,"ranks":[{"rank":4,"host":"h1","local_rank":0,"pid":42},` +
			`{"rank":5,"host":"h1","local_rank":1,"pid":43}],"groups":[{"id":"w","type":"world","ranks":[0,1,2,3,4,5]}]}`, sampleTopo()},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ld := EncodeLogs("h1", []detector.Topology{tc.want}, nil, nil)
			if tc.body != "" {
				ld.ResourceLogs().At(0).ScopeLogs().At(0).LogRecords().At(0).Body().SetStr(tc.body)
			}
			b, err := plogotlp.NewExportRequestFromLogs(ld).MarshalProto()
			if err != nil {
				t.Fatal(err)
			}
			req := plogotlp.NewExportRequest()
			if err := req.UnmarshalProto(b); err != nil {
				t.Fatal(err)
			}
			d := DecodeLogs(req.Logs(), Limits{})
			if d.Rejected != 0 || len(d.Facts) != 1 || d.Facts[0].Topology == nil {
				t.Fatalf("decoded %+v (%v)", d, d.FirstErr)
			}
			if got := *d.Facts[0].Topology; !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}
