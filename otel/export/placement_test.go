package export

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/slowrank/slowrank/detector"
)

var testPlaced = detector.RankInfo{Rank: 2, Host: "gpu-node-7", LocalRank: 2, PID: 4242, Placement: detector.Placement{
	K8s:         detector.K8sPod{PodName: "llama-worker-0", PodUID: "6f1c0e4a-2b8d-4c7e-9a51-3d2f8b7e1c90", Namespace: "train", ContainerName: "pytorch"},
	ContainerID: "4f3a1d2e9b8c7a6f5e4d3c2b1a0f9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f",
	Slurm:       detector.SlurmStep{JobID: "4711", StepID: "2"},
	GPU:         detector.RankGPU{Index: 3, UUID: "GPU-5b1e3a8c-0d2f-4e6a-8b9c-1a2b3c4d5e6f", PCIBusID: "00000000:3B:00.0"},
}}

// The topology's placement of a rank reaches its train.step spans under
// semantic-convention names, and its per-rank metrics under dcgm-exporter's
// label names; a rank the topology does not place gets none of them.
func TestPlacementOnSpansAndMetrics(t *testing.T) {
	h := newHarness(t, Policy{}, QueueConfig{})
	h.e.RecordTopology(detector.Topology{Kind: detector.KindTopology, Job: testJob, Version: 1,
		Ranks: []detector.RankInfo{{Rank: 1, Host: "gpu-node-7", LocalRank: 1}, testPlaced}})
	h.feedWindow(testJob, 0, 4, 2, 20)
	h.e.SettleWindow(testJob, 0, []detector.Verdict{stragglerVerdict(testJob, 0, 2, detector.StateStraggler)})
	h.flush(t)

	wantSpan := map[attribute.Key]attribute.Value{
		"k8s.pod.name":               attribute.StringValue("llama-worker-0"),
		"k8s.pod.uid":                attribute.StringValue("6f1c0e4a-2b8d-4c7e-9a51-3d2f8b7e1c90"),
		"k8s.namespace.name":         attribute.StringValue("train"),
		"k8s.container.name":         attribute.StringValue("pytorch"),
		"container.id":               attribute.StringValue(testPlaced.ContainerID),
		"host.name":                  attribute.StringValue("gpu-node-7"),
		"process.pid":                attribute.IntValue(4242),
		"slowrank.slurm.job_id":      attribute.StringValue("4711"),
		"slowrank.slurm.step_id":     attribute.StringValue("2"),
		"slowrank.device.uuid":       attribute.StringValue("GPU-5b1e3a8c-0d2f-4e6a-8b9c-1a2b3c4d5e6f"),
		"slowrank.device.index":      attribute.IntValue(3),
		"slowrank.device.pci_bus_id": attribute.StringValue("00000000:3B:00.0"),
	}
	seen := map[int64]int{}
	for _, s := range stepSpans(h.spans.GetSpans()) {
		r := attrOf(s.Attributes, AttrRank).AsInt64()
		seen[r]++
		for k, want := range wantSpan {
			got := attrOf(s.Attributes, k)
			switch {
			case r == 2 && got != want:
				t.Fatalf("rank 2 span: %s = %v, want %v", k, got.String(), want.String())
			case r == 1 && k == "host.name" && got != want:
				t.Fatalf("rank 1 span: host.name = %q, want the topology's host", got.String())
			case r != 2 && k != "host.name" && got.Type() != attribute.EMPTY:
				t.Fatalf("rank %d span has %s = %v: the topology does not place it", r, k, got.String())
			}
		}
	}
	if seen[1] == 0 || seen[2] == 0 {
		t.Fatalf("spans per rank %v: want ranks 1 and 2 side by side", seen)
	}

	rm := collect(t, h.reader)
	wantLabels := map[attribute.Key]string{
		"UUID": "GPU-5b1e3a8c-0d2f-4e6a-8b9c-1a2b3c4d5e6f", "gpu": "3", "pci_bus_id": "00000000:3B:00.0",
		"Hostname": "gpu-node-7", "pod": "llama-worker-0", "namespace": "train", "container": "pytorch", "hpc_job": "4711",
	}
	with := func(rank string, extra map[attribute.Key]string) map[attribute.Key]string {
		m := map[attribute.Key]string{KeyRank: rank}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
	if v := gaugeInt(rm, MetricStraggler, with("2", wantLabels)); v != 1 {
		t.Errorf("straggler gauge with rank 2's placement labels: %d, want 1", v)
	}
	if v := gaugeInt(rm, MetricState, with("2", wantLabels)); v != StateCode(detector.StateStraggler) {
		t.Errorf("state gauge with rank 2's placement labels: %d", v)
	}
	for _, name := range []string{MetricStepDuration, MetricPhaseDuration} {
		m, _ := findMetric(rm, name)
		hist, ok := m.Data.(metricdata.Histogram[float64])
		if !ok {
			t.Fatalf("%s: %#v", name, m.Data)
		}
		for _, dp := range hist.DataPoints {
			rank, _ := dp.Attributes.Value(KeyRank)
			_, hasUUID := dp.Attributes.Value(KeyUUID)
			host, _ := dp.Attributes.Value(KeyHostname)
			switch rank.AsInt64() {
			case 2:
				if !matches(dp.Attributes, wantLabels) {
					t.Errorf("%s rank 2: labels %v, want %v", name, dp.Attributes.ToSlice(), wantLabels)
				}
			case 1:
				if hasUUID || host.AsString() != "gpu-node-7" {
					t.Errorf("%s rank 1: labels %v, want only Hostname of the placement", name, dp.Attributes.ToSlice())
				}
			default:
				if hasUUID || dp.Attributes.HasValue(KeyHostname) {
					t.Errorf("%s rank %d without topology: labels %v", name, rank.AsInt64(), dp.Attributes.ToSlice())
				}
			}
		}
	}
}

// The labels keep dcgm-exporter's names through the OpenTelemetry-to-
// Prometheus translation (the agent's /metrics, and the Collector's
// Prometheus exporter, use the same one): the PromQL join of docs/deploy.md,
// `on (UUID)`, needs the exact name.
func TestPlacementLabelsInPrometheus(t *testing.T) {
	reg := prometheus.NewRegistry()
	pe, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo())
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(context.Background(), Config{Job: testJob, HostName: "testhost", Env: testEnv(nil),
		Traces: KindNone, Metrics: KindNone, MetricReaders: []sdkmetric.Reader{pe}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Shutdown(context.Background()) })
	e.RecordTopology(detector.Topology{Kind: detector.KindTopology, Job: testJob, Version: 1, Ranks: []detector.RankInfo{testPlaced}})
	e.RecordStep(stepFact(testJob, 2, 0, 0), 0)
	e.SettleWindow(testJob, 0, []detector.Verdict{stragglerVerdict(testJob, 0, 2, detector.StateStraggler)})

	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"UUID": testPlaced.GPU.UUID, "gpu": "3", "pci_bus_id": "00000000:3B:00.0", "Hostname": "gpu-node-7",
		"pod": "llama-worker-0", "namespace": "train", "container": "pytorch", "hpc_job": "4711", "rank": "2"}
	found := 0
	for _, f := range fams {
		if f.GetName() != "slowrank_straggler" && f.GetName() != "slowrank_step_duration_milliseconds" {
			continue
		}
		for _, m := range f.GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			for k, v := range want {
				if got[k] != v {
					t.Errorf("%s: label %s = %q, want %q (labels %v)", f.GetName(), k, got[k], v, got)
				}
			}
			found++
		}
	}
	if found != 2 {
		t.Fatalf("%d series of slowrank_straggler and slowrank_step_duration_milliseconds, want 2", found)
	}
}
