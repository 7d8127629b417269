package discover

import (
	"testing"

	"github.com/slowrank/slowrank/detector"
)

// Discovery of fake processes (testdata/proc-cluster): what their cgroup
// and downward-API environment say becomes the placement the topology
// carries.
func TestDiscoverPlacement(t *testing.T) {
	const node = "gpu-node-7"
	got, _, err := Discover("testdata/proc-cluster", Selector{})
	if err != nil {
		t.Fatal(err)
	}
	want := map[int]detector.Placement{
		// The environment's POD_UID is stale: the cgroup's wins.
		700: {K8s: detector.K8sPod{PodName: "llama-worker-0", PodUID: "6f1c0e4a-2b8d-4c7e-9a51-3d2f8b7e1c90", Namespace: "train", ContainerName: "pytorch"},
			ContainerID: "4f3a1d2e9b8c7a6f5e4d3c2b1a0f9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f"},
		// No POD_NAME: in a pod, HOSTNAME is the pod's name.
		701: {K8s: detector.K8sPod{PodName: "bert-worker-1", PodUID: "0b7d2c1e-5f4a-4e3b-8c2d-1a0f9e8d7c6b", Namespace: "ml-team", ContainerName: "trainer"},
			ContainerID: "9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f4f3a1d2e9b8c7a6f5e4d3c2b1a0f"},
		702: {Slurm: detector.SlurmStep{JobID: "4711", StepID: "2"}},
	}
	if len(got) != len(want) {
		t.Fatalf("discovered %d processes, want %d", len(got), len(want))
	}
	for _, p := range got {
		if pl := p.Identity.Placement(node); pl != want[p.PID] {
			t.Errorf("pid %d: placement\n%+v\nwant\n%+v", p.PID, pl, want[p.PID])
		}
	}
}
