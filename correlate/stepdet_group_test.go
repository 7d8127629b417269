package correlate

import (
	"fmt"
	"sort"
	"testing"

	"github.com/slowrank/slowrank/detector"
)

// TestGroupPhaseKept: the Trainer's five synchronisations per iteration
// (groups of five instances, group.go) keep their phase through a
// logging step whose calls jitter (a spike of the burst on the group's
// count is no boundary), idle time after a logging step's calls (no
// boundary either) and a data-loading stall (a long first instance of the
// group).
func TestGroupPhaseKept(t *testing.T) {
	tests := []struct {
		name string
		iter func(i int) ([]loopCall, int64)
	}{{
		name: "logging steps with spikes",
		iter: func(i int) ([]loopCall, int64) {
			cs, d := trainerIter(i)
			if i%50 == 49 {
				// every fifth logging synchronisation 3x later after the
				// previous one, the first of them on the group's count
				for k := range cs {
					if cs[k].at >= 35*ms {
						if j := (cs[k].at - 35*ms) / (220 * us); j%5 == 1 {
							cs[k].at += 400 * us
						}
					}
				}
			}
			return cs, d
		},
	}, {
		// host work after the last logging synchronisation (writing the
		// logs): the next iteration's first synchronisation dominates the
		// logging ones and lasts as long as the dominant instances
		name: "idle time after the logging calls",
		iter: func(i int) ([]loopCall, int64) {
			cs, d := trainerIter(i)
			if i%50 == 49 {
				d += 20 * ms
			}
			return cs, d
		},
	}, {
		name: "a data-loading stall every 30",
		iter: func(i int) ([]loopCall, int64) {
			cs, d := trainerIter(i)
			if i%30 == 7 {
				for k := range cs {
					cs[k].at += 20 * ms
				}
				d += 20 * ms
			}
			return cs, d
		},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, starts, ends := runTrainerLoop(1200*ms, 600, tc.iter)
			checkDominantEnds(t, checkIterations(t, c, starts, ends, 0, 0), starts, ends, tc.iter)
		})
	}
}

// runTrainerLoop feeds one rank's Trainer loop to a new correlator: the
// model's copy to the GPU, gap later the n iterations of iter. It returns
// the correlator and the iterations' starts and ends.
func runTrainerLoop(gap int64, n int, iter func(i int) ([]loopCall, int64)) (c *Correlator, starts, ends []int64) {
	c = New(Config{})
	c.SetRank(RankInfo{PID: pid(0), Rank: 0, WorldSize: 1, Host: "h0", Job: "j1"})
	pre, end := paramCopies(6, 0)
	starts, ends = feedLoop(c, pid(0), loopScript{pre: pre, preNS: end + gap, n: n, iter: iter})
	return c, starts, ends
}

// checkDominantEnds checks that every step ends with the return of its
// iteration's longest call (the synchronisation that waits for the
// forward and backward pass) and that step k is iteration k.
func checkDominantEnds(t *testing.T, steps []detector.Step, starts, ends []int64, iter func(int) ([]loopCall, int64)) {
	t.Helper()
	for k, s := range steps {
		i := sort.Search(len(ends), func(j int) bool { return ends[j] >= s.EndNS })
		cs, _ := iter(i)
		var dom loopCall
		for _, lc := range cs {
			if lc.dur > dom.dur {
				dom = lc
			}
		}
		if want := starts[i] + dom.at + dom.dur; int64(i) != s.Step || k != i || s.EndNS != want {
			t.Fatalf("step %d (fact %d) ends in iteration %d at %d ns, %d ns after its longest call's return", s.Step, k, i, s.EndNS-starts[i], s.EndNS-want)
		}
	}
}

// scaleIter shortens (f > 1) or lengthens (f < 1) an iteration's calls
// and its length by f.
func scaleIter(cs []loopCall, d int64, f float64) ([]loopCall, int64) {
	out := make([]loopCall, len(cs))
	for k, lc := range cs {
		lc.at = int64(float64(lc.at) / f)
		lc.dur = max(1, int64(float64(lc.dur)/f))
		out[k] = lc
	}
	return out, int64(float64(d) / f)
}

// Logging steps of trainerPaced.
const (
	logFull = iota // of the old length
	logNew         // of the new length, plus their logging calls
	logNone        // none after the change of pace
)

// trainerPaced is trainerIter b times shorter, whose iterations from
// iteration at on are f times shorter still (f < 1: longer), with logging
// steps of mode log.
func trainerPaced(b float64, at int, f float64, log int) func(int) ([]loopCall, int64) {
	base := func(cs []loopCall, d int64) ([]loopCall, int64) { return scaleIter(cs, d, b) }
	return func(i int) ([]loopCall, int64) {
		if i < at || i%50 == 49 && log == logFull {
			return base(trainerIter(i))
		}
		cs, d := trainerIter(1) // the five synchronisations
		cs, d = scaleIter(cs, d, b*f)
		if i%50 == 49 && log == logNew {
			lg, _ := trainerIter(i)
			end := cs[4].at + cs[4].dur
			for _, lc := range lg[5:] {
				lc.at += end + 500*us - 34*ms
				cs = append(cs, lc)
			}
			d = max(d, end) + 30*ms
		}
		return cs, d
	}
}

// TestGroupPaceChange: the Trainer's five synchronisations per iteration
// (groups of five, group.go) whose iterations get 3x or 10x shorter, or 3x
// longer, after iteration 100, with a logging step every 50 (an
// all-gather and 100 synchronisations) of the old length, or of the new
// one plus its logging calls, or none: one step per iteration, step k
// iteration k. (The grouping waited for an instance at least half the
// last dominant one after a logging step, which shorter iterations never
// reach: 111 facts for 600 iterations.)
func TestGroupPaceChange(t *testing.T) {
	for _, f := range []float64{3, 10, 1.0 / 3} {
		for _, log := range []int{logFull, logNew, logNone} {
			name := fmt.Sprintf("%gx shorter", f)
			if f < 1 {
				name = fmt.Sprintf("%gx longer", 1/f)
			}
			name += []string{", logging steps of full length", ", logging steps of the new length", ", no logging steps"}[log]
			t.Run(name, func(t *testing.T) {
				iter := trainerPaced(1, 100, f, log)
				c, starts, ends := runTrainerLoop(1200*ms, 1200, iter)
				checkDominantEnds(t, checkIterations(t, c, starts, ends, 0, 0), starts, ends, iter)
				t.Logf("BurstSteps %d", burstSteps(c))
			})
		}
	}
}

// TestGroupNewPaceAfterLostPhase: the Trainer's five synchronisations
// per iteration (groups of five) get 3x or 10x shorter right after a
// logging step whose extra calls (101 synchronisations) are no multiple
// of the group: the phase is lost and cannot be kept by the count, and the
// dominant duration is still the old pace's, which the new iterations
// never reach half of. A run of groups at one position, the first
// dominating, that lasts twice the lock's recent steps is a new pace
// (newPace): its instances end steps and the dominant duration is learned
// again. One step per iteration, step k iteration k. (The grouping waited
// for an instance half as long as the last dominant one: 111 facts for
// 600 iterations, 193796a.)
func TestGroupNewPaceAfterLostPhase(t *testing.T) {
	for _, f := range []float64{3, 10} {
		t.Run(fmt.Sprintf("%gx shorter", f), func(t *testing.T) {
			iter := func(i int) ([]loopCall, int64) {
				if i >= 100 {
					cs, d := trainerIter(1) // the five synchronisations
					return scaleIter(cs, d, f)
				}
				cs, d := trainerIter(i)
				if i == 99 { // a logging step of 101 synchronisations
					cs = append(cs, loopCall{sync: true, at: 35*ms + 100*220*us, dur: 5 * us})
				}
				return cs, d
			}
			c, starts, ends := runTrainerLoop(1200*ms, 400, iter)
			checkDominantEnds(t, checkIterations(t, c, starts, ends, 0, 0), starts, ends, iter)
		})
	}
}

// TestGroupPaceChangeTentative: as TestGroupPaceChange, at the fake
// trainer's pace (iterations of 14.8 ms, then 3x or 10x shorter, or 3x
// longer, from iteration 100 on, logging steps of full length; the
// TestReplayTrainerSpeedup captures), one rank of two seen: the fallback
// clock's first lock is still tentative at the change and at the third
// logging step, when the all-gather's communicator (one step per 50
// iterations) locks. The synchronisation clock stays (one longer step
// among its latest is no irregularity), the grouping finds its phase
// after each logging step without withdrawing the lock's steps, and the
// confirmation withdraws the model's copy to the GPU only.
func TestGroupPaceChangeTentative(t *testing.T) {
	for _, f := range []float64{3, 10, 1.0 / 3} {
		name := fmt.Sprintf("%gx shorter", f)
		if f < 1 {
			name = fmt.Sprintf("%gx longer", 1/f)
		}
		t.Run(name, func(t *testing.T) {
			c := New(Config{})
			c.SetRank(RankInfo{PID: pid(0), Rank: 0, WorldSize: 2, Host: "h0", Job: "j1"})
			pre, end := paramCopies(6, 0)
			iter := trainerPaced(2.5, 100, f, logFull)
			starts, ends := feedLoop(c, pid(0), loopScript{pre: pre, preNS: end + 2*ms, n: 400, comm: true, ranks: 2, iter: iter})
			checkDominantEnds(t, checkIterations(t, c, starts, ends, 0, 0), starts, ends, iter)
		})
	}
}

// ncclTrainerIter is an iteration of the fake NCCL trainer
// (test/integration's reattach test): four all-reduces, then a
// cudaStreamSynchronize that waits for the GPU, 17.4 ms in all (one
// instance of the cycle per iteration). A stall of the host before its
// first call (a preemption) lengthens it by stall[i].
func ncclTrainerIter(stall map[int]int64) func(i int) ([]loopCall, int64) {
	return func(i int) ([]loopCall, int64) {
		cs := []loopCall{
			{op: "allreduce", count: 6553601, at: 0, dur: 7 * us}, {op: "allreduce", count: 4915202, at: 700 * us, dur: 3 * us},
			{op: "allreduce", count: 3276803, at: 1400 * us, dur: 3 * us}, {op: "allreduce", count: 1638404, at: 2100 * us, dur: 2 * us},
			{sync: true, at: 3 * ms, dur: 8600 * us}}
		d := 17400 * us
		if s := stall[i]; s > 0 {
			delayFrom(cs, 0, s)
			d += s
		}
		return cs, d
	}
}

// TestGroupStallsKeepOneInstancePerIteration: preemptions of the host that
// stretch every other iteration of a one-instance cycle, while its first
// lock is tentative, mimic two instances per iteration, the second
// dominating (group.go, findGroup). After steady iterations such groups
// must hold settledReps of them (stalled: seven stalls still made a
// grouping); a grouping they made all the same (no steady iterations
// before them) has the regroup's own stalled instance for its dominant
// duration, which no later iteration reaches, and a run of alike
// iterations ends it (ungroup), its brevity guard (a logging step's calls)
// measured against a dominant duration that steps have held only. One step
// per iteration, step k iteration k. (loaded-stalls-keep-one-instance of
// TestReplayReattachStallsKeepOneInstancePerIteration: 0 facts for 150.)
func TestGroupStallsKeepOneInstancePerIteration(t *testing.T) {
	tests := []struct {
		name  string
		stall map[int]int64
	}{
		{"three stalls at every other iteration", map[int]int64{9: 23 * ms, 11: 50 * ms, 13: 24 * ms}},
		{"five stalls at every other iteration", map[int]int64{9: 23 * ms, 11: 50 * ms, 13: 24 * ms, 15: 30 * ms, 17: 25 * ms}},
		{"seven stalls at every other iteration", map[int]int64{9: 23 * ms, 11: 50 * ms, 13: 24 * ms, 15: 30 * ms, 17: 25 * ms, 19: 25 * ms, 21: 25 * ms}},
		{"three stalls from the second iteration", map[int]int64{1: 23 * ms, 3: 50 * ms, 5: 24 * ms}},
		{"three stalls, then more", map[int]int64{9: 23 * ms, 11: 50 * ms, 13: 24 * ms, 22: 5 * ms, 23: 28 * ms, 24: 27 * ms, 26: 12 * ms}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := New(Config{})
			c.SetRank(RankInfo{PID: pid(0), Rank: 0, WorldSize: 4, Host: "h0", Job: "j1"})
			iter := ncclTrainerIter(tc.stall)
			starts, ends := feedLoop(c, pid(0), loopScript{n: 150, comm: true, ranks: 4, iter: iter})
			checkDominantEnds(t, checkIterations(t, c, starts, ends, 0, 0), starts, ends, iter)
		})
	}
}
