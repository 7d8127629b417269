package agent

import (
	"log/slog"
	"testing"

	"github.com/slowrank/slowrank/agent/discover"
	"github.com/slowrank/slowrank/agent/pipeline"
	"github.com/slowrank/slowrank/correlate"
	"github.com/slowrank/slowrank/detector"
)

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
	fake := &fakeGPU{}
	a := &Agent{
		log:  slog.New(slog.DiscardHandler),
		att:  &attacher{gpu: fake, procs: map[discover.ProcessKey]*procEntry{pe.proc.ProcessKey: pe}},
		pipe: pipeline.New(pipeline.Config{Correlator: corr, Detector: det}),
		gpu:  fake,
	}
	a.pipe.SetRank(pe.info)
	// The test reads the topologies straight from the correlator the
	// pipeline feeds: what the agent sent, before any detector.
	if _, topos := corr.Flush(); len(topos) != 1 || topos[0].Ranks[0].GPU != (detector.RankGPU{}) {
		t.Fatalf("first topology %+v, want one without a GPU", topos)
	}

	gpu := detector.RankGPU{Index: 3, UUID: "GPU-3", PCIBusID: "00000000:3B:00.0"}
	fake.placed = map[int]detector.RankGPU{100: gpu}
	a.refreshPlacements()
	_, topos := corr.Drain()
	want := pod
	want.GPU = gpu
	if len(topos) != 1 || topos[0].Version != 2 || topos[0].Ranks[0].Placement != want {
		t.Fatalf("after NVML found the GPU: %+v, want version 2 with %+v", topos, want)
	}

	a.refreshPlacements()
	fake.placed = map[int]detector.RankGPU{}
	a.refreshPlacements()
	if _, topos := corr.Drain(); len(topos) != 0 {
		t.Fatalf("unchanged or vanished GPU made topology %+v", topos)
	}
	if pe.info.Placement.GPU != gpu {
		t.Errorf("rank's GPU %+v, want it kept: %+v", pe.info.Placement.GPU, gpu)
	}
}

// fakeGPU is NVML's evidence as a test sets it: only the placements.
type fakeGPU struct {
	gpuSource
	placed map[int]detector.RankGPU
}

func (f *fakeGPU) Placement(pid int) (detector.RankGPU, bool) {
	rg, ok := f.placed[pid]
	return rg, ok
}
