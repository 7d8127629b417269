package detector

import "testing"

func TestTopologyVersionsArePruned(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Lateness = 0
	d, _ := New(cfg)
	for v := 1; v <= 100; v++ {
		if err := d.AddTopology(Topology{Job: "a", Version: v, Groups: []Group{{ID: "dp", Type: "dp", Ranks: []int{0, 1}}}}); err != nil {
			t.Fatal(err)
		}
		if _, err := d.AddStep(Step{Job: "a", Topo: v, Rank: 0, Step: int64(v), EndNS: int64(v) * 6e9, Phases: map[string]float64{"compute": 1}}); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(d.jobs["a"].topos); n > 3 {
		t.Fatalf("%d topology versions kept after 100, want only those still in use", n)
	}
}
