package agent

import (
	"log/slog"
	"testing"

	"github.com/slowrank/slowrank/agent/discover"
	"github.com/slowrank/slowrank/agent/pipeline"
	"github.com/slowrank/slowrank/correlate"
	"github.com/slowrank/slowrank/detector"
)

func TestRankGPU(t *testing.T) {
	g := func(idx int, mem uint64) GPUProcess {
		return GPUProcess{PID: 1, GPUIndex: idx, UUID: "GPU-" + string(rune('a'+idx)), UsedMemory: mem, PCIBusID: "00000000:1" + string(rune('0'+idx)) + ":00.0"}
	}
	tests := []struct {
		name string
		gs   []GPUProcess
		want detector.RankGPU
		ok   bool
	}{
		{"no context", nil, detector.RankGPU{}, false},
		{"one GPU", []GPUProcess{g(3, 70<<30)}, detector.RankGPU{Index: 3, UUID: "GPU-d", PCIBusID: "00000000:13:00.0"}, true},
		{"one GPU, memory unknown", []GPUProcess{g(2, MemoryUnknown)}, detector.RankGPU{Index: 2, UUID: "GPU-c", PCIBusID: "00000000:12:00.0"}, true},
		{"stray context on GPU 0", []GPUProcess{g(5, 70<<30), g(0, 500<<20)}, detector.RankGPU{Index: 5, UUID: "GPU-f", PCIBusID: "00000000:15:00.0"}, true},
		{"two alike", []GPUProcess{g(1, 1<<30), g(2, 1<<30)}, detector.RankGPU{}, false},
		{"memory unknown on one of two", []GPUProcess{g(1, 1<<30), g(2, MemoryUnknown)}, detector.RankGPU{}, false},
		{"no UUID", []GPUProcess{{GPUIndex: 1}}, detector.RankGPU{}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := rankGPU(tc.gs)
			if got != tc.want || ok != tc.ok {
				t.Errorf("got %+v %v, want %+v %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

// A container and a pod as their cgroup names them (as in
// agent/identity's tests).
const (
	testCID = "4f3a1d2e9b8c7a6f5e4d3c2b1a0f9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f"
	testUID = "6f1c0e4a-2b8d-4c7e-9a51-3d2f8b7e1c90"
)

// The GPU that NVML finds after the rank was announced reaches the
// topology as a new version; a poll that no longer lists the process (it is
// exiting) changes nothing.
func TestRefreshPlacementsSendsTheGPU(t *testing.T) {
	det, err := detector.New(detector.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	pod := detector.Placement{K8s: detector.K8sPod{PodName: "w-0", PodUID: testUID}, ContainerID: testCID}
	pe := &procEntry{proc: discover.Process{ProcessKey: discover.ProcessKey{PID: 100}}, rank: 0, job: "j1",
		info: correlate.RankInfo{PID: 100, Rank: 0, WorldSize: 1, Host: "h0", Job: "j1", Placement: pod}}
	corr := correlate.New(correlate.Config{})
	a := &Agent{
		log:  slog.New(slog.DiscardHandler),
		att:  &attacher{procs: map[discover.ProcessKey]*procEntry{pe.proc.ProcessKey: pe}},
		pipe: pipeline.New(pipeline.Config{Correlator: corr, Detector: det}),
		gpu:  newGPUEvidence(nil),
	}
	a.pipe.SetRank(pe.info)
	// The test reads the topologies straight from the correlator the
	// pipeline feeds: what the agent sent, before any detector.
	if _, topos := corr.Flush(); len(topos) != 1 || topos[0].Ranks[0].GPU != (detector.RankGPU{}) {
		t.Fatalf("first topology %+v, want one without a GPU", topos)
	}

	gpu := detector.RankGPU{Index: 3, UUID: "GPU-3", PCIBusID: "00000000:3B:00.0"}
	a.gpu.placed = map[int]detector.RankGPU{100: gpu}
	a.refreshPlacements()
	_, topos := corr.Drain()
	want := pod
	want.GPU = gpu
	if len(topos) != 1 || topos[0].Version != 2 || topos[0].Ranks[0].Placement != want {
		t.Fatalf("after NVML found the GPU: %+v, want version 2 with %+v", topos, want)
	}

	a.refreshPlacements()
	a.gpu.placed = map[int]detector.RankGPU{}
	a.refreshPlacements()
	if _, topos := corr.Drain(); len(topos) != 0 {
		t.Fatalf("unchanged or vanished GPU made topology %+v", topos)
	}
	if pe.info.Placement.GPU != gpu {
		t.Errorf("rank's GPU %+v, want it kept: %+v", pe.info.Placement.GPU, gpu)
	}
}
