package detector_test

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/slowrank/slowrank/detector"
)

// gpuJob generates the steps of a GPU-bound synchronous job: every rank's
// host work hides behind queued GPU work and then waits for its GPU in a
// device synchronisation (sync_wait), so step = host + sync_wait and the GPU
// idles idleMS per step.
type gpuJob struct {
	ranks          int
	stepMS         float64
	hostMS, idleMS float64
	windows        int
	// gpuSteps(w) is how many of each rank's first steps in window w carry
	// device records (duty cycle); 0: none.
	gpuSteps func(w int) int
	// jitter(r, w) is rank r's hidden extra host time in window w (ms): its
	// sync wait shrinks by as much, its step and GPU idle do not change.
	jitter func(r, w int) float64
	// A stall of stallMS on rank stallRank from window stallFrom, growing by
	// stallGrowMS per window, lengthens every rank's step: the rank's GPU
	// idles for it, its peers wait longer.
	stallRank, stallFrom int
	stallMS, stallGrowMS float64
	// collMS > 0: every rank waits about collMS per step in blocking
	// collectives (coll_wait, gloo), and a rank's peers wait there for its
	// stall. jitterWaits: they wait for its hidden jitter too, without a step
	// getting longer (4 ranks on one shared GPU: the GPU runs the peers'
	// kernels meanwhile, so the peers would have waited anyway).
	collMS      float64
	jitterWaits bool
	// shift(w) is a change of every rank's step time in window w (ms) that
	// no rank causes (nil: none): the GPU work of all ranks got longer.
	shift func(w int) float64
}

const winNS = int64(5 * time.Second)

// stall is the stalled rank's extra host time in window w.
func (g gpuJob) stall(w int) float64 {
	if (g.stallMS <= 0 && g.stallGrowMS <= 0) || w < g.stallFrom {
		return 0
	}
	return g.stallMS + g.stallGrowMS*float64(w-g.stallFrom)
}

// delays are how late each rank arrives at the collectives in window w.
func (g gpuJob) delays(w int) (ds []float64, latest float64) {
	ds = make([]float64, g.ranks)
	for r := range ds {
		if g.jitterWaits {
			ds[r] = g.jitter(r, w)
		}
		if r == g.stallRank {
			ds[r] += g.stall(w)
		}
		latest = max(latest, ds[r])
	}
	return ds, latest
}

func (g gpuJob) steps(rng *rand.Rand) []detector.Step {
	var out []detector.Step
	t := int64(0)
	perWin := map[[2]int]int{}
	for k := int64(0); ; k++ {
		w := int(t / winNS)
		if w >= g.windows {
			return out
		}
		stall, shift := g.stall(w), 0.0
		if g.shift != nil {
			shift = g.shift(w)
		}
		delays, latest := g.delays(w)
		step := g.stepMS*(1+0.002*rng.NormFloat64()) + stall + shift
		end := t + int64(step*1e6)
		for r := 0; r < g.ranks; r++ {
			host := g.hostMS*(1+0.02*rng.NormFloat64()) + g.jitter(r, w)
			idle := g.idleMS + 0.1*rng.Float64()
			if r == g.stallRank {
				host += stall
				idle += stall
			}
			ph := map[string]float64{"step": step, "host": host, "sync_wait": step - host}
			if g.collMS > 0 {
				ph["coll_wait"] = g.collMS + 0.2*rng.Float64() + latest - delays[r]
			}
			key := [2]int{r, w}
			gpu := perWin[key] < g.gpuSteps(w)
			perWin[key]++
			if gpu {
				// A peer waiting for the stalled rank spins in communication
				// kernels: its compute and idle do not change.
				ph["idle"] = idle
				ph["compute"] = (g.stepMS-g.idleMS)*(1+0.002*rng.NormFloat64()) + shift
			}
			out = append(out, detector.Step{Kind: detector.KindStep, Job: "j", Rank: r, Step: k,
				StartNS: t, EndNS: end, Phases: ph, GPU: gpu, Workload: &detector.Workload{FP: "same"}})
		}
		t = end
	}
}

// randomJob draws a job shape, a duty cycle and hidden jitter.
func randomJob(rng *rand.Rand) (gpuJob, string) {
	g := gpuJob{
		ranks:   2 + rng.IntN(7),
		stepMS:  50 + 150*rng.Float64(),
		windows: 12,
	}
	g.hostMS = g.stepMS * (0.1 + 0.3*rng.Float64())
	g.idleMS = 1 + 2*rng.Float64()
	var duty string
	switch rng.IntN(3) {
	case 0:
		duty = "no device records"
		g.gpuSteps = func(int) int { return 0 }
	case 1:
		n := 1 + rng.IntN(30)
		duty = fmt.Sprintf("device records on the first %d steps of every window", n)
		g.gpuSteps = func(int) int { return n }
	default:
		on := rng.Uint64()
		duty = fmt.Sprintf("device records in windows %b", on&0xfff)
		g.gpuSteps = func(w int) int { return int(on>>w&1) * 4 }
	}
	// Jitter by turns: each rank's extra host time holds for 1-4 windows.
	amp := make([][]float64, g.ranks)
	for r := range amp {
		amp[r] = make([]float64, g.windows)
		for w := 0; w < g.windows; {
			a := 0.0
			if rng.IntN(2) == 0 {
				a = 0.55 * g.hostMS * rng.Float64()
			}
			for n := 1 + rng.IntN(4); n > 0 && w < g.windows; n-- {
				amp[r][w] = a
				w++
			}
		}
	}
	g.jitter = func(r, w int) float64 { return amp[r][w] }
	// Blocking collectives (gloo) in one job of two; in half of those the
	// peers also wait for the hidden jitter while no step gets longer (a
	// shared GPU): victim_wait then overstates, and only the job's step rise
	// tells. That needs a baseline, so such jitter starts after 3 windows.
	switch rng.IntN(4) {
	case 0:
		g.collMS = g.stepMS * 0.3 * rng.Float64()
		duty += fmt.Sprintf(", %.0f ms collective waits", g.collMS)
	case 1:
		g.collMS, g.jitterWaits = g.stepMS*0.3*rng.Float64(), true
		duty += fmt.Sprintf(", %.0f ms collective waits that the jitter from window 3 lengthens", g.collMS)
		g.jitter = func(r, w int) float64 { return amp[r][w] * float64(min(1, w/3)) }
	}
	return g, duty
}

func TestPropertyHiddenHostJitterNeverAlerts(t *testing.T) {
	rng := rand.New(rand.NewPCG(16, 1))
	seedAlerts, capped := 0, 0
	for trial := 0; trial < 60; trial++ {
		g, duty := randomJob(rng)
		steps := g.steps(rng)
		desc := fmt.Sprintf("trial %d: %d ranks, %.0f ms steps, %.0f ms host, %s", trial, g.ranks, g.stepMS, g.hostMS, duty)
		cfg := detector.DefaultConfig()
		cfg.EmitOK = true
		for _, v := range judge(t, cfg, steps) {
			if v.State == detector.StateStraggler || v.State == detector.StateCandidate {
				t.Fatalf("%s: hidden jitter judged %s: %s", desc, v.State, v.Reason)
			}
			if v.Exposure != nil && v.Exposure.Capped && v.Exposure.PeerCollWaitMS != nil &&
				d(v.Exposure.PeerCollWaitMS)-d(v.Exposure.CollWaitMS) >= v.Exposure.ExcessMS {
				capped++ // the peers' waits alone would have exposed it all
			}
		}
		seed := detector.DefaultConfig()
		seed.Exposure = false
		for _, v := range judge(t, seed, steps) {
			if v.State == detector.StateStraggler {
				seedAlerts++
				break
			}
		}
	}
	if seedAlerts == 0 {
		t.Fatal("the seed's rule raised no alert on any trial: the jitter does not test the gate")
	}
	if capped == 0 {
		t.Fatal("no peers' waits were held to the job's step rise: the jitter does not test the cap")
	}
}

func d(p *float64) float64 { return *p }

func TestPropertyExposedHostStallAlwaysAlerts(t *testing.T) {
	rng := rand.New(rand.NewPCG(16, 2))
	for trial := 0; trial < 60; trial++ {
		g, duty := randomJob(rng)
		g.stallRank = rng.IntN(g.ranks)
		g.stallFrom = rng.IntN(7)
		g.stallMS = g.stepMS * (0.05 + 0.25*rng.Float64())
		// Hidden jitter stays on the stalled rank during the stall only: on a
		// peer it would lower the excess that the seed's rule itself needs,
		// and before the stall it is the other property.
		jitter := g.jitter
		g.jitter = func(r, w int) float64 {
			if r != g.stallRank || w < g.stallFrom {
				return 0
			}
			return jitter(r, w)
		}
		steps := g.steps(rng)
		desc := fmt.Sprintf("trial %d: %d ranks, %.0f ms steps, %.1f ms stall on rank %d from window %d, %s",
			trial, g.ranks, g.stepMS, g.stallMS, g.stallRank, g.stallFrom, duty)
		// Evidence exists in each of the stall's first 3 windows when the rank
		// has device records there, its peers wait in blocking collectives,
		// or the job has 3 clean windows of step-time baseline. The stall
		// raises the job's step, so the step rise never hides it.
		evidence := g.stallFrom >= 3 || g.collMS > 0
		if !evidence {
			evidence = true
			for w := g.stallFrom; w < g.stallFrom+3; w++ {
				evidence = evidence && g.gpuSteps(w) > 0
			}
		}
		first := int64(-1)
		for _, v := range judge(t, detector.DefaultConfig(), steps) {
			if v.State == detector.StateRecovered {
				// The stall lasts to the end: its own windows never become
				// the step-time baseline that would hide it.
				t.Fatalf("%s: window %d recovered while the stall goes on: %s", desc, v.Window, v.Reason)
			}
			if v.State != detector.StateStraggler {
				continue
			}
			if v.Rank != g.stallRank || v.Phase != "host" {
				t.Fatalf("%s: alert on rank %d %s: %s", desc, v.Rank, v.Phase, v.Reason)
			}
			if first < 0 {
				first = v.Window
			}
		}
		switch want := int64(g.stallFrom + 2); {
		case evidence && first != want:
			t.Fatalf("%s: first alert in window %d, want %d (the stall's third window)", desc, first, want)
		case !evidence && first >= 0 && first < want:
			t.Fatalf("%s: alert in window %d before the stall's third window", desc, first)
		}
	}
}

func TestExposureEvidence(t *testing.T) {
	base := gpuJob{ranks: 4, stepMS: 100, hostMS: 25, idleMS: 2, windows: 6,
		gpuSteps: func(int) int { return 10 }, jitter: func(int, int) float64 { return 0 }, stallRank: 3}
	tests := []struct {
		name     string
		job      func(gpuJob) gpuJob
		exposure bool
		window   int64  // the window judged
		state    string // rank 3's host state in it ("" for ok)
		evidence string
		reason   string
	}{
		{"hidden jitter with device records is ok", func(g gpuJob) gpuJob {
			g.jitter = func(r, w int) float64 { return map[bool]float64{true: 10}[r == 3] }
			return g
		}, true, 5, "", detector.EvidenceIdle, ""},
		{"the seed's rule alerts on the same jitter", func(g gpuJob) gpuJob {
			g.jitter = func(r, w int) float64 { return map[bool]float64{true: 10}[r == 3] }
			return g
		}, false, 5, "straggler", "", "fastest of 3"},
		{"a stall that idles the GPU is exposed by idle", func(g gpuJob) gpuJob {
			g.stallMS = 10
			return g
		}, true, 2, "straggler", detector.EvidenceIdle, "its GPU idled 12."},
		{"without device records a stall shows against the step's past", func(g gpuJob) gpuJob {
			g.stallMS, g.stallFrom = 10, 3
			g.gpuSteps = func(int) int { return 0 }
			return g
		}, true, 5, "straggler", detector.EvidenceStepTime, "above its 100."},
		{"without device records a stall after a burst of every rank's step shows against the steps since", func(g gpuJob) gpuJob {
			g.windows, g.gpuSteps = 13, func(int) int { return 0 }
			g.shift = func(w int) float64 { return map[bool]float64{true: 8}[w >= 1 && w < 8] }
			g.stallMS, g.stallFrom = 10, 10
			return g
		}, true, 12, "straggler", detector.EvidenceStepTime, "rose 9.9"},
		{"without device records or a baseline nothing tells", func(g gpuJob) gpuJob {
			g.stallMS = 10
			g.gpuSteps = func(int) int { return 0 }
			return g
		}, true, 0, "uncertain", detector.EvidenceNone, "nothing shows whether it lengthens a step"},
		{"a stall from the start without device records stays uncertain in its first windows", func(g gpuJob) gpuJob {
			g.stallMS = 10
			g.gpuSteps = func(int) int { return 0 }
			return g
		}, true, 2, "uncertain", detector.EvidenceNone, "2 of 3 windows of step-time baseline"},
		// Its uncertain windows teach a weak baseline, which would show a
		// later rise but never shows the stall hidden.
		{"a stall from the start without device records stays uncertain on its weak baseline", func(g gpuJob) gpuJob {
			g.stallMS = 10
			g.gpuSteps = func(int) int { return 0 }
			return g
		}, true, 5, "uncertain", detector.EvidenceStepTime, "learned in windows whose deviations lacked evidence"},
		{"device records later find a stall present from the start", func(g gpuJob) gpuJob {
			g.stallMS = 10
			g.gpuSteps = func(w int) int { return map[bool]int{true: 5}[w >= 3] }
			return g
		}, true, 5, "straggler", detector.EvidenceIdle, "exposed"},
		{"peers' waits beyond the job's step rise are hidden", func(g gpuJob) gpuJob {
			g.gpuSteps, g.collMS, g.jitterWaits = func(int) int { return 0 }, 30, true
			g.jitter = func(r, w int) float64 { return map[bool]float64{true: 10}[r == 3 && w >= 3] }
			return g
		}, true, 5, "", detector.EvidenceVictimWait, "its peers waited 40.1"},
		{"peers' waits with a step that rose as much are exposed", func(g gpuJob) gpuJob {
			g.gpuSteps, g.collMS = func(int) int { return 0 }, 30
			g.stallMS, g.stallFrom = 10, 3
			return g
		}, true, 5, "straggler", detector.EvidenceVictimWait, "exposed: its peers waited 40."},
		{"a stall from the start is judged by its peers' waits: no window is clean to learn its step", func(g gpuJob) gpuJob {
			g.gpuSteps, g.collMS, g.windows = func(int) int { return 0 }, 30, 10
			g.stallMS = 10
			return g
		}, true, 9, "straggler", detector.EvidenceVictimWait, "exposed: its peers waited 40."},
		{"a rise of every rank's step does not expose jitter that idle shows hidden", func(g gpuJob) gpuJob {
			g.shift = func(w int) float64 { return map[bool]float64{true: 10}[w >= 3] }
			g.jitter = func(r, w int) float64 { return map[bool]float64{true: 10}[r == 3 && w >= 3] }
			return g
		}, true, 5, "", detector.EvidenceIdle, "its GPU idled 2."},
		{"a fall of every rank's step as a stall starts does not hide what idle shows", func(g gpuJob) gpuJob {
			g.shift = func(w int) float64 { return map[bool]float64{true: -15}[w >= 3] }
			g.stallMS, g.stallFrom = 10, 3
			return g
		}, true, 5, "straggler", detector.EvidenceIdle, "its GPU idled 12."},
		{"the baseline follows a rise of every rank's step, so peers' waits stay hidden", func(g gpuJob) gpuJob {
			g.windows, g.gpuSteps, g.collMS, g.jitterWaits = 10, func(int) int { return 0 }, 30, true
			g.shift = func(w int) float64 { return map[bool]float64{true: 10}[w >= 2] }
			g.jitter = func(r, w int) float64 { return map[bool]float64{true: 10}[r == 3 && w >= 7] }
			return g
		}, true, 9, "", detector.EvidenceVictimWait, "but the job's step rose only"},
		{"the baseline follows a fall of every rank's step, so a later stall is found", func(g gpuJob) gpuJob {
			g.windows, g.gpuSteps, g.collMS = 10, func(int) int { return 0 }, 30
			g.shift = func(w int) float64 { return map[bool]float64{true: -15}[w >= 2] }
			g.stallMS, g.stallFrom = 10, 7
			return g
		}, true, 9, "straggler", detector.EvidenceVictimWait, "exposed: its peers waited 40."},
		{"hidden jitter without device records is ok once a baseline exists", func(g gpuJob) gpuJob {
			g.gpuSteps = func(int) int { return 0 }
			g.jitter = func(r, w int) float64 { return map[bool]float64{true: 10}[r == 3 && w >= 3] }
			return g
		}, true, 5, "", detector.EvidenceStepTime, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := tc.job(base)
			cfg := detector.DefaultConfig()
			cfg.Exposure, cfg.EmitOK = tc.exposure, true
			vs := judge(t, cfg, g.steps(rand.New(rand.NewPCG(1, 1))))
			var last detector.Verdict
			for _, v := range vs {
				if v.Rank == 3 && v.Phase == "host" && v.Window == tc.window {
					last = v
				}
			}
			state := last.State
			if state == detector.StateOK {
				state = ""
			}
			if state != tc.state {
				t.Fatalf("state %q, want %q (%s)", last.State, tc.state, last.Reason)
			}
			switch {
			case tc.evidence == "" && last.Exposure != nil:
				t.Errorf("exposure %+v with the gate off", last.Exposure)
			case tc.evidence != "" && (last.Exposure == nil || last.Exposure.Evidence != tc.evidence):
				t.Errorf("exposure %+v, want evidence %s", last.Exposure, tc.evidence)
			}
			if !strings.Contains(last.Reason, tc.reason) {
				t.Errorf("reason %q lacks %q", last.Reason, tc.reason)
			}
		})
	}
}

// A stall that grows a little every window must not teach the baseline it is
// measured against: once it is over the threshold, it alerts and stays, on
// every kind of evidence.
func TestExposureFindsAStallThatGrowsSlowly(t *testing.T) {
	// From window 4 (after 4 clean windows: a stall there from the start
	// stays uncertain without device records) +0.5 % of the step per window.
	ramp := gpuJob{ranks: 4, stepMS: 100, hostMS: 25, idleMS: 2, windows: 34, stallRank: 3,
		stallFrom: 4, stallMS: 0.5, stallGrowMS: 0.5,
		gpuSteps: func(int) int { return 0 }, jitter: func(int, int) float64 { return 0 }}
	tests := []struct {
		name     string
		job      func(gpuJob) gpuJob
		evidence string
	}{
		{"the job's step time alone", func(g gpuJob) gpuJob { return g }, detector.EvidenceStepTime},
		{"peers' waits held to the step rise", func(g gpuJob) gpuJob { g.collMS = 30; return g }, detector.EvidenceVictimWait},
		{"its GPU idle", func(g gpuJob) gpuJob { g.gpuSteps = func(int) int { return 10 }; return g }, detector.EvidenceIdle},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := tc.job(ramp)
			first := int64(-1)
			for _, v := range judge(t, detector.DefaultConfig(), g.steps(rand.New(rand.NewPCG(3, 3)))) {
				if v.Rank != 3 || v.Phase != "host" {
					t.Fatalf("verdict on rank %d %s: %s", v.Rank, v.Phase, v.Reason)
				}
				switch {
				case v.State == detector.StateStraggler && first < 0:
					first = v.Window
					if v.Exposure == nil || v.Exposure.Evidence != tc.evidence {
						t.Errorf("alert exposure %+v, want evidence %s", v.Exposure, tc.evidence)
					}
				case first >= 0 && v.State != detector.StateStraggler:
					t.Fatalf("window %d %s after the alert while the stall grows: %s", v.Window, v.State, v.Reason)
				}
			}
			// By window 19 the stall is 8 % of the step: 3 windows later at most.
			if first < 0 || first > 21 {
				t.Fatalf("first alert in window %d, want by window 21", first)
			}
			t.Logf("first alert in window %d", first)
		})
	}
}

func TestExposureSilentStragglerDoesNotTeachItsStall(t *testing.T) {
	// Rank 3's host stall (15 % of the step, exposed: its peers wait for it
	// in collectives) raises an alert; then rank 3 sends nothing for 8
	// windows (a silent host) while its peers' steps still hold the stall.
	// Those windows must not become the job's past: when rank 3 returns,
	// stalled as before, the step rise still shows it.
	g := gpuJob{ranks: 4, stepMS: 100, hostMS: 25, idleMS: 2, windows: 26, stallRank: 3,
		stallFrom: 4, stallMS: 15, collMS: 30,
		gpuSteps: func(int) int { return 0 }, jitter: func(int, int) float64 { return 0 }}
	const silentFrom, silentTo = 10, 18 // windows [silentFrom, silentTo)
	var steps []detector.Step
	for _, s := range g.steps(rand.New(rand.NewPCG(5, 5))) {
		if w := int(s.EndNS / winNS); s.Rank == 3 && w >= silentFrom && w < silentTo {
			continue
		}
		steps = append(steps, s)
	}
	alerted, after := false, 0
	for _, v := range judge(t, detector.DefaultConfig(), steps) {
		if v.Rank != 3 || v.Phase != "host" {
			continue
		}
		switch {
		case v.State == detector.StateStraggler && v.Window < silentFrom:
			alerted = true
		case v.State == detector.StateRecovered || v.State == detector.StateOK:
			t.Fatalf("window %d %s while rank 3 is still stalled: %s", v.Window, v.State, v.Reason)
		case v.State == detector.StateStraggler && v.Window >= silentTo:
			after++
		}
	}
	if !alerted || after == 0 {
		t.Fatalf("alert before the silence %v, straggler windows after it %d: want both", alerted, after)
	}
}
