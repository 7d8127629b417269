package aggregate

import "github.com/slowrank/slowrank/detector"

// sampleStep is one valid step fact of job j1 from host h1 (the wire
// package's tests cover every field; these only need a fact that passes).
func sampleStep() detector.Step {
	return detector.Step{Kind: detector.KindStep, Job: "j1", Rank: 5, Step: 120, Host: "h1",
		StartNS: 1_000_000, EndNS: 27_000_000, GPU: true,
		Phases: map[string]float64{"step": 26, "compute": 21.2, "host": 3.1, "sync_wait": 18}}
}
