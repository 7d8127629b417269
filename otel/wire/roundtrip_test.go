package wire

import (
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/pdata/plog/plogotlp"

	"github.com/slowrank/slowrank/detector"
)

// roundTripFacts holds every kind of fact the encoder writes, with every
// optional field both given and absent: steps with all fields, none, a
// phase this version does not name, false and zero optional values; and
// topologies without ranks, with ranks and groups, with the full placement
// of a rank next to partial ones (the optional placement fields), in two
// jobs.
func roundTripFacts() ([]detector.Topology, []detector.Step) {
	full := sampleStep()
	minimal := detector.Step{Kind: detector.KindStep, Job: "j1", Rank: 0, Step: 0, Host: "h1",
		StartNS: 0, EndNS: 0, Phases: map[string]float64{}}
	custom := detector.Step{Kind: detector.KindStep, Job: "j2", Rank: MaxRank - 1, Step: 1 << 40, Host: "h1",
		StartNS: 5_000_000, EndNS: 9_000_000, Phases: map[string]float64{"data_load": 0, "step": 4},
		Workload: &detector.Workload{FP: "only-fp"}, LastArrival: ptr(false), ArrivalLagMS: ptr(0.0),
		DeviceLastArrival: ptr(true), DeviceArrivalLagMS: ptr(0.0), DeviceCollMS: ptr(0.0)}
	tokensOnly := detector.Step{Kind: detector.KindStep, Job: "j2", Rank: 1, Step: 2, Host: "h1",
		StartNS: 1, EndNS: 2, Phases: map[string]float64{"compute": 1e-3}, Workload: &detector.Workload{Tokens: 1}}

	placed := sampleTopo()
	placed.Ranks = append(placed.Ranks,
		detector.RankInfo{Rank: 6, Host: "h1", LocalRank: 2, PID: 44, Placement: detector.Placement{
			K8s:         detector.K8sPod{PodName: "llama-worker-0", PodUID: "6f1c0e4a-2b8d-4c7e-9a51-3d2f8b7e1c90", Namespace: "train", ContainerName: "pytorch"},
			ContainerID: "4f3a1d2e9b8c7a6f5e4d3c2b1a0f9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f",
			Slurm:       detector.SlurmStep{JobID: "4711", StepID: "2"},
			GPU:         detector.RankGPU{Index: 3, UUID: "GPU-5b1e3a8c-0d2f-4e6a-8b9c-1a2b3c4d5e6f", PCIBusID: "00000000:3B:00.0"},
		}},
		detector.RankInfo{Rank: 7, Host: "h1", LocalRank: 3, Placement: detector.Placement{GPU: detector.RankGPU{Index: 0, UUID: "GPU-0"}}},
		detector.RankInfo{Rank: 8, Host: "h1", LocalRank: 4, Placement: detector.Placement{Slurm: detector.SlurmStep{JobID: "4711"}}},
		detector.RankInfo{Rank: 9, Host: "h1", LocalRank: 5, Placement: detector.Placement{K8s: detector.K8sPod{Namespace: "train"}}},
	)
	empty := detector.Topology{Kind: detector.KindTopology, Job: "j2", Version: 0}
	return []detector.Topology{placed, empty}, []detector.Step{full, minimal, custom, tokensOnly}
}

// wantOrder is the order the decoder yields facts in: per job in order of
// first appearance, its topologies, then its steps.
func wantOrder(topos []detector.Topology, steps []detector.Step) []Fact {
	var jobs []string
	add := func(j string) {
		if !slices.Contains(jobs, j) {
			jobs = append(jobs, j)
		}
	}
	for _, t := range topos {
		add(t.Job)
	}
	for _, s := range steps {
		add(s.Job)
	}
	var out []Fact
	for _, j := range jobs {
		for i := range topos {
			if topos[i].Job == j {
				out = append(out, Fact{Host: "h1", SentMono: 30_000_000, Topology: &topos[i]})
			}
		}
		for i := range steps {
			if steps[i].Job == j {
				out = append(out, Fact{Host: steps[i].Host, SentMono: 30_000_000, Step: &steps[i]})
			}
		}
	}
	return out
}

// TestRoundTrip encodes every fact kind, sends it through both OTLP
// encodings a receiver accepts (protobuf and JSON) and decodes it back:
// what the agent meant is what the aggregator gets.
func TestRoundTrip(t *testing.T) {
	topos, steps := roundTripFacts()
	ld := EncodeLogs("h1", topos, steps, func(ns int64) time.Time { return time.Unix(0, ns) })
	StampSent(ld, 30_000_000)
	want := wantOrder(topos, steps)
	for _, enc := range []struct {
		name      string
		marshal   func(plogotlp.ExportRequest) ([]byte, error)
		unmarshal func(plogotlp.ExportRequest, []byte) error
	}{
		{"protobuf", plogotlp.ExportRequest.MarshalProto, plogotlp.ExportRequest.UnmarshalProto},
		{"json", plogotlp.ExportRequest.MarshalJSON, plogotlp.ExportRequest.UnmarshalJSON},
	} {
		t.Run(enc.name, func(t *testing.T) {
			b, err := enc.marshal(plogotlp.NewExportRequestFromLogs(ld))
			if err != nil {
				t.Fatal(err)
			}
			req := plogotlp.NewExportRequest()
			if err := enc.unmarshal(req, b); err != nil {
				t.Fatal(err)
			}
			d := DecodeLogs(req.Logs(), Limits{})
			if d.Rejected != 0 || d.Ignored != 0 {
				t.Fatalf("rejected %d, ignored %d: %v", d.Rejected, d.Ignored, d.FirstErr)
			}
			if len(d.Facts) != len(want) {
				t.Fatalf("%d facts, want %d", len(d.Facts), len(want))
			}
			for i := range want {
				if !reflect.DeepEqual(d.Facts[i], want[i]) {
					t.Errorf("fact %d:\n got %s\nwant %s", i, describe(d.Facts[i]), describe(want[i]))
				}
			}
		})
	}
}

func describe(f Fact) string {
	if f.Step != nil {
		return fmt.Sprintf("step from %s: %+v", f.Host, *f.Step)
	}
	if f.Topology != nil {
		return fmt.Sprintf("topology from %s: %+v", f.Host, *f.Topology)
	}
	return "empty fact"
}

// TestRoundTripSenderHost: a step without its own host and a topology rank
// without one both arrive with the sender's.
func TestRoundTripSenderHost(t *testing.T) {
	s := sampleStep()
	s.Host = ""
	topo := detector.Topology{Kind: detector.KindTopology, Job: "j1", Version: 1, Ranks: []detector.RankInfo{{Rank: 0}}}
	d := DecodeLogs(EncodeLogs("sender", []detector.Topology{topo}, []detector.Step{s}, nil), Limits{})
	if d.Rejected != 0 || len(d.Facts) != 2 {
		t.Fatalf("%+v (%v)", d, d.FirstErr)
	}
	if h := d.Facts[0].Topology.Ranks[0].Host; h != "sender" {
		t.Errorf("topology rank host %q, want the sender's", h)
	}
	if d.Facts[1].Host != "sender" || d.Facts[1].Step.Host != "sender" {
		t.Errorf("step host %q / %q, want the sender's", d.Facts[1].Host, d.Facts[1].Step.Host)
	}
}

// TestEncodeLogsSchema pins the records' framing: one resource per job with
// nothing but service.name and the job, the scope, the event names and the
// routing trace id.
func TestEncodeLogsSchema(t *testing.T) {
	topos, steps := roundTripFacts()
	ld := EncodeLogs("h1", topos, steps, nil)
	if ld.ResourceLogs().Len() != 2 {
		t.Fatalf("%d resources, want one per job", ld.ResourceLogs().Len())
	}
	for i, job := range []string{"j1", "j2"} {
		rl := ld.ResourceLogs().At(i)
		if got := rl.Resource().Attributes().AsRaw(); len(got) != 2 || got["service.name"] != ServiceName || got[AttrJob] != job {
			t.Errorf("resource %d: %v", i, got)
		}
		sl := rl.ScopeLogs().At(0)
		if sl.Scope().Name() != ScopeName {
			t.Errorf("scope %q", sl.Scope().Name())
		}
		if v, ok := sl.Scope().Attributes().Get(AttrSentMonoNS); !ok || v.Int() != 0 {
			t.Errorf("unstamped scope: %v", sl.Scope().Attributes().AsRaw())
		}
		for k := 0; k < sl.LogRecords().Len(); k++ {
			lr := sl.LogRecords().At(k)
			kind, _ := lr.Attributes().Get(AttrKind)
			wantEvent := map[string]string{KindStep: EventStep, KindTopology: EventTopology}[kind.Str()]
			if wantEvent == "" || lr.EventName() != wantEvent || lr.TraceID() != RouteTraceID(job) {
				t.Errorf("record %d of %s: kind %q, event %q, trace id %v", k, job, kind.Str(), lr.EventName(), lr.TraceID())
			}
		}
	}
	StampSent(ld, 42)
	forEachScope(ld, func(sl plog.ScopeLogs) {
		if v, _ := sl.Scope().Attributes().Get(AttrSentMonoNS); v.Int() != 42 {
			t.Errorf("StampSent left %v", v.AsRaw())
		}
	})
}

func forEachScope(ld plog.Logs, f func(plog.ScopeLogs)) {
	for i := 0; i < ld.ResourceLogs().Len(); i++ {
		sls := ld.ResourceLogs().At(i).ScopeLogs()
		for j := 0; j < sls.Len(); j++ {
			f(sls.At(j))
		}
	}
}
