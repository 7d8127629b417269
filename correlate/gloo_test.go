package correlate

import (
	"compress/gzip"
	"fmt"
	"os"
	"sort"
	"testing"

	"github.com/slowrank/slowrank/detector"
)

// Replays of bench/gpu/host_exposure.sh (bench/gpu/train.py, 4 gloo ranks,
// rank 1 sleeping at a fixed point of every iteration from some iteration
// on), converted from the agent's --dump-events with dump2records.py. Per
// iteration the detector sees the loop's stop all-reduce (before the
// iteration's t0) and the gradient buckets' all-reduces, all without
// sizes (a burstDet), each followed by its Work::wait; on the GPU also
// gloo's cudaStreamSynchronize on its worker threads and the timer's
// cudaDeviceSynchronize. A fact ends after the stop all-reduce (CPU) or
// after the last bucket (GPU, where the timer's synchronisation lies in
// the boundary gap before the stop all-reduce): either way inside
// [t0ₖ, t0ₖ₊₁), so a step is the iteration whose [t0ₖ, t0ₖ₊₁) holds its
// end.

// glooRank is what a replay made of one rank's steps.
type glooRank struct {
	steps   []detector.Step
	outside int   // facts before the first iteration
	first   int   // iteration of the earliest fact, -1: none
	per     []int // facts per iteration
}

// replayGloo feeds a records file at the given tick and maps every
// rank's steps to its iterations; iterOf gives, per step index, each
// rank's iteration of it.
func replayGloo(t *testing.T, path string, tick int64) (ranks []glooRank, iterOf map[int64]map[int]int) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }() // read only
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	_, steps, iters := feedTrainerRecords(t, zr, tick)
	iterOf = map[int64]map[int]int{}
	for rank := range len(iters) {
		its := iters[rank]
		r := glooRank{first: -1, per: make([]int, len(its))}
		for _, s := range steps {
			if s.Rank != rank {
				continue
			}
			r.steps = append(r.steps, s)
			// The latest iteration whose t0 is before the step's end.
			k := sort.Search(len(its), func(k int) bool { return its[k][0] > s.EndNS }) - 1
			if k < 0 {
				r.outside++
				continue
			}
			r.per[k]++
			if r.first < 0 || k < r.first {
				r.first = k
			}
			if iterOf[s.Step] == nil {
				iterOf[s.Step] = map[int]int{}
			}
			iterOf[s.Step][rank] = k
		}
		ranks = append(ranks, r)
	}
	if len(ranks) != 4 {
		t.Fatalf("%d ranks with iterations, want 4", len(ranks))
	}
	return ranks, iterOf
}

// several counts the iterations of per[from:to] with more than one fact.
func several(per []int, from, to int) int {
	n := 0
	for _, v := range per[from:to] {
		if v > 1 {
			n++
		}
	}
	return n
}

// TestReplayGlooWaitsNotInGaps replays the CPU capture of a 4-rank gloo job
// (testdata/gloo-host-stall-end-4ranks, see testdata/open/README.md):
// three all-reduces without sizes per iteration, each followed by a
// Work::wait that blocks until the slowest peer called it. Measured from
// return to entry, the gap before the second bucket held the wait for the
// peers' backward pass and the boundary dominated its burst in only 58–77
// % of the iterations, so the gap lock broke again and again (263–380
// facts in 469 iterations). With the waits of the collectives' thread
// taken out of the gaps, every iteration before rank 1's host stall
// (iteration 469 on) is one fact on every rank, from iteration 0. The
// earliest burst whose start gap dominates the calls before it is
// iteration 1's (before iteration 0's lie the init's barrier and a call
// 67 ms after it), so that the lock's first step was iteration 2; it now
// reaches back over iteration 1's burst and iteration 0's, whose start
// gap dominates every gap inside it (burst.go, reachBack).
// TestReplayGlooHostStallKeepsSteps checks the whole capture.
func TestReplayGlooWaitsNotInGaps(t *testing.T) {
	const upTo = 469 // the stall starts in iteration 469
	for _, tick := range []int64{200e6, 50e6, 1e9} {
		t.Run(fmt.Sprintf("tick %d ms", tick/1e6), func(t *testing.T) {
			ranks, _ := replayGloo(t, "testdata/gloo-host-stall-end-4ranks.records.gz", tick)
			for rank, r := range ranks {
				n := 0
				for _, v := range r.per[:upTo] {
					n += v
				}
				sev := several(r.per, 0, upTo)
				msg := fmt.Sprintf("rank %d: %d facts in iterations 0–%d, first in %d, %d iterations with several",
					rank, n, upTo-1, r.first, sev)
				if d := n - (upTo - r.first); r.first != 0 || d < -1 || d > 1 || sev > 0 {
					t.Error(msg)
				} else {
					t.Log(msg)
				}
			}
		})
	}
}

// TestReplayGlooHostStallKeepsSteps: on every rank, every iteration of the
// whole capture from the first one the gap lock can cut is one fact, and
// step k is the same iteration on every rank. The stalled rank has two
// long gaps per iteration after its stall begins, the boundary's and the
// one with the sleep, neither dominating the other by burstRatio; its
// confirmed lock keeps the bursts by their count (keptByCount) where it
// missed twice and broke, and nothing found a period again (CPU: 7 facts
// in the 293 iterations after the stall; H200: rank 1 171 of 464 and 178
// of 395 facts, none after the stall's first iteration).
//
// first is each rank's first fact. The gap lock's first step reaches
// back from the burst after the earliest dominated one over every earlier
// burst that is a whole iteration (burst.go, reachBack: the cycle's
// tokens, a start gap that dominates every gap inside it and is of a
// boundary's size). On the CPU that is iteration 0's burst (its two
// buckets and iteration 1's stop all-reduce, after the init's barrier and
// iteration 0's stop all-reduce). On the H200 the burst is the stop
// all-reduce and the buckets; iteration 0's holds the first forward pass
// (a 372 ms gap before its first bucket, which neither the 14 ms before
// it nor the 85 ms after it dominate), so that it is no step, and the
// first is iteration 1 (before the reach-back: 3, and 4 on ranks 0 and 1
// of the 60 ms run, whose iteration 1's first bucket came 29 ms after its
// stop all-reduce, against 48 ms at its end: the burst is whole, its end
// being the next burst's verified start, but dominated by nothing after
// it). ±1: the last iteration's burst is reported only when the next call
// comes, the job's final barrier, which need not dominate it (every rank
// makes it here).
func TestReplayGlooHostStallKeepsSteps(t *testing.T) {
	tests := []struct {
		name, file string
		first      [4]int
	}{
		{"CPU, 30 ms after the optimizer step from iteration 469", "gloo-host-stall-end-4ranks", [4]int{0, 0, 0, 0}},
		{"H200, 15 ms after the optimizer step from iteration 180", "h200-gloo-host-stall-end-4ranks", [4]int{1, 1, 1, 1}},
		{"H200, 15 ms before the forward pass from iteration 174", "h200-gloo-host-stall-start-4ranks", [4]int{1, 1, 1, 1}},
		{"H200, 60 ms before the forward pass from iteration 182", "h200-gloo-host-stall-start60-4ranks", [4]int{1, 1, 1, 1}},
	}
	for _, tc := range tests {
		for _, tick := range []int64{200e6, 50e6, 1e9} {
			t.Run(fmt.Sprintf("%s, tick %d ms", tc.name, tick/1e6), func(t *testing.T) {
				ranks, iterOf := replayGloo(t, "testdata/"+tc.file+".records.gz", tick)
				for rank, r := range ranks {
					sev := several(r.per, 0, len(r.per))
					want := len(r.per) - tc.first[rank]
					msg := fmt.Sprintf("rank %d: %d facts for %d iterations, first in %d (want %d), %d before the first, %d iterations with several",
						rank, len(r.steps), len(r.per), r.first, tc.first[rank], r.outside, sev)
					if d := len(r.steps) - want; d < -1 || d > 1 || r.first != tc.first[rank] || r.outside > 0 || sev > 0 {
						t.Error(msg)
					} else {
						t.Log(msg)
					}
					checkContiguous(t, r.steps)
				}
				checkSameIterations(t, iterOf)
			})
		}
	}
}
